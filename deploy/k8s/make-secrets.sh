#!/usr/bin/env bash
# Makes the two Secrets the manifests mount (base/harrier.env points the
# binaries at them) and prints them as YAML on stdout:
#   harrier-tls    kubernetes.io/tls: tls.crt, tls.key (one certificate for
#                  servers and workers, serverAuth + clientAuth) and ca.crt
#                  (the CA that signed it, which both sides check against)
#   harrier-token  token: the job token (32 random bytes, hex)
#
#   deploy/k8s/make-secrets.sh [--shards N] [--namespace NS] [--dir DIR] \
#     [--san DNS]... | kubectl apply -n NS -f -
#
# The certificate names every shard, in both forms, for i < N (what workers
# dial; N from --shards, default HARRIER_NUM_SHARDS of base/harrier.env:
# pass your overlay's count): harrier-server-<i>-0.harrier (the JobSet's
# pod names, base) and harrier-server-<i>.harrier-server (the headless
# Service of overlays/no-jobset), and *.harrier.<NS>.svc[.cluster.local],
# *.harrier-server.<NS>.svc[.cluster.local] when --namespace is given. One-label wildcards (*.harrier-server) are not
# used: gRPC and OpenSSL refuse to match them. --san adds names. --dir keeps the files (ca.key too, to sign more later); without it
# they go into a temporary directory removed on exit. Needs openssl.
set -euo pipefail

namespace=""
dir=""
shards="$(sed -n 's/^HARRIER_NUM_SHARDS=\([0-9][0-9]*\)$/\1/p' "$(dirname "$0")/base/harrier.env")"
sans=()
days=365
while [ $# -gt 0 ]; do
  case "$1" in
    --namespace) namespace="$2"; shift 2 ;;
    --namespace=*) namespace="${1#*=}"; shift ;;
    --shards) shards="$2"; shift 2 ;;
    --shards=*) shards="${1#*=}"; shift ;;
    --dir) dir="$2"; shift 2 ;;
    --dir=*) dir="${1#*=}"; shift ;;
    --san) sans+=("$2"); shift 2 ;;
    --san=*) sans+=("${1#*=}"); shift ;;
    --days) days="$2"; shift 2 ;;
    --days=*) days="${1#*=}"; shift ;;
    -h|--help) sed -n '2,23s/^# \{0,1\}//p' "$0"; exit 0 ;;
    *) echo "make-secrets.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ "${shards}" =~ ^[1-9][0-9]*$ ]] || { echo "make-secrets.sh: --shards must be a positive integer" >&2; exit 2; }
command -v openssl >/dev/null || { echo "make-secrets.sh: openssl not found (apt-get install openssl)" >&2; exit 1; }

if [ -z "${dir}" ]; then
  dir="$(mktemp -d)"
  trap 'rm -rf "${dir}"' EXIT
else
  mkdir -p "${dir}"
fi
umask 077

names=("harrier-server")
for ((i = 0; i < shards; i++)); do
  names+=("harrier-server-${i}-0.harrier" "harrier-server-${i}.harrier-server")
done
if [ -n "${namespace}" ]; then
  for sub in harrier harrier-server; do
    names+=("*.${sub}.${namespace}.svc" "*.${sub}.${namespace}.svc.cluster.local")
  done
fi
names+=("${sans[@]+"${sans[@]}"}")
san_line=""
for n in "${names[@]}"; do san_line="${san_line:+${san_line},}DNS:${n}"; done

openssl req -x509 -newkey rsa:2048 -nodes -days "${days}" -subj "/CN=harrier-ca" \
  -keyout "${dir}/ca.key" -out "${dir}/ca.crt" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
  2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj "/CN=harrier" \
  -keyout "${dir}/tls.key" -out "${dir}/tls.csr" 2>/dev/null
printf '%s\n' "subjectAltName=${san_line}" "basicConstraints=critical,CA:FALSE" \
  "keyUsage=critical,digitalSignature,keyEncipherment" "extendedKeyUsage=serverAuth,clientAuth" \
  > "${dir}/tls.ext"
openssl x509 -req -in "${dir}/tls.csr" -CA "${dir}/ca.crt" -CAkey "${dir}/ca.key" \
  -CAcreateserial -days "${days}" -extfile "${dir}/tls.ext" -out "${dir}/tls.crt" 2>/dev/null
openssl rand -hex 32 > "${dir}/token"
rm -f "${dir}/tls.csr" "${dir}/tls.ext" "${dir}/ca.srl"

b64() { base64 -w0 < "$1"; }
cat <<YAML
---
apiVersion: v1
kind: Secret
metadata:
  name: harrier-tls
type: kubernetes.io/tls
data:
  tls.crt: $(b64 "${dir}/tls.crt")
  tls.key: $(b64 "${dir}/tls.key")
  ca.crt: $(b64 "${dir}/ca.crt")
---
apiVersion: v1
kind: Secret
metadata:
  name: harrier-token
type: Opaque
data:
  token: $(b64 "${dir}/token")
YAML
echo "make-secrets.sh: certificate for ${san_line}, valid ${days} days" >&2
