#!/usr/bin/env bash
# Offline validation of Harrier's Kubernetes manifests (deploy/k8s).
# Run tests/k8s/install.sh once first. Prints one line per check,
#   PASS <check>   or   FAIL <check>   (followed by the details, indented),
# then "N passed, M failed"; exits 1 if any check failed.
#
# Checks: yamllint on the sources; for the base and every overlay: render
# with kubectl kustomize, schema (kubernetes-models JSON schemas: types,
# required fields, enums), types (TypeScript check against the
# kubernetes-models interfaces: also rejects unknown fields), policy
# (Harrier's rules, and what each overlay promises); scaling through the
# ConfigMap; and that deliberately broken fixtures are rejected.
set -u

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "${here}/../.." && pwd)"
k8s="${root}/deploy/k8s"
tmp="$(mktemp -d)"
trap 'rm -rf "${tmp}"' EXIT

passed=0
failed=0

# report STATUS NAME [DETAILS_FILE]
report() {
  if [ "$1" -eq 0 ]; then
    echo "PASS $2"
    passed=$((passed + 1))
  else
    echo "FAIL $2"
    failed=$((failed + 1))
    if [ -n "${3:-}" ] && [ -s "$3" ]; then sed -n '1,40s/^/    /p' "$3"; fi
  fi
}

finish() {
  echo "${passed} passed, ${failed} failed"
  [ "${failed}" -eq 0 ]
  exit $?
}

check() { node "${here}/check.js" "$@"; }

# Prerequisites.
missing=""
for tool in kubectl node yamllint; do
  command -v "${tool}" >/dev/null 2>&1 || missing="${missing} ${tool}"
done
[ -d "${here}/node_modules/kubernetes-models" ] || missing="${missing} node_modules"
if [ -n "${missing}" ]; then
  echo "missing:${missing} (run tests/k8s/install.sh)" > "${tmp}/prereq"
  report 1 "prerequisites" "${tmp}/prereq"
  finish
fi
report 0 "prerequisites"

# Lint the sources (the broken fixture too: it is broken in content only).
yamllint -s -c "${here}/yamllint.yaml" "${k8s}" "${here}/fixtures/broken" "${here}/fixtures/scaled" \
  "${here}/yamllint.yaml" > "${tmp}/lint" 2>&1
report $? "yamllint deploy/k8s" "${tmp}/lint"

# Render and validate the base and every overlay.
for target in base overlays/cpu overlays/gpu overlays/gpu-rdma; do
  out="${tmp}/$(echo "${target}" | tr / _).yaml"
  if ! kubectl kustomize "${k8s}/${target}" > "${out}" 2> "${tmp}/err"; then
    report 1 "render ${target}" "${tmp}/err"
    continue
  fi
  report 0 "render ${target}"
  check --check=schema "${out}" > "${tmp}/err" 2>&1
  report $? "schema ${target}" "${tmp}/err"
  check --check=types "${out}" > "${tmp}/err" 2>&1
  report $? "types ${target}" "${tmp}/err"
  overlay=""
  case "${target}" in overlays/*) overlay="--overlay=${target#overlays/}" ;; esac
  check --check=policy ${overlay} "${out}" > "${tmp}/err" 2>&1
  report $? "policy ${target}" "${tmp}/err"
done

# Scaling is one edit: the ConfigMap's counts drive replicas/completions.
if kubectl kustomize "${here}/fixtures/scaled" > "${tmp}/scale.yaml" 2> "${tmp}/err"; then
  { check --check=policy --overlay=cpu "${tmp}/scale.yaml" \
      && grep -q '^  replicas: 4$' "${tmp}/scale.yaml" \
      && grep -q '^  completions: 8$' "${tmp}/scale.yaml"; } > "${tmp}/err" 2>&1
  report $? "scale fixtures/scaled (shards=4 workers=8 via harrier-config)" "${tmp}/err"
else
  report 1 "scale fixtures/scaled (shards=4 workers=8 via harrier-config)" "${tmp}/err"
fi

# expect_reject NAME OUTPUT_FILE STATUS PATTERN...: the check must have
# failed, and its output must name every PATTERN (the planted errors).
expect_reject() {
  local name="$1" out="$2" status="$3"
  shift 3
  if [ "${status}" -eq 0 ]; then
    echo "accepted, but must be rejected" > "${tmp}/why"
    report 1 "${name}" "${tmp}/why"
    return
  fi
  : > "${tmp}/why"
  for pattern in "$@"; do
    grep -q -- "${pattern}" "${out}" || echo "rejected, but not for '${pattern}':" >> "${tmp}/why"
  done
  [ -s "${tmp}/why" ] && cat "${out}" >> "${tmp}/why"
  [ ! -s "${tmp}/why" ]
  report $? "${name}" "${tmp}/why"
}

# The broken fixture renders (kustomize checks no field names) but must be
# rejected: unknown field spec.replicaz, misspelled container field
# imagePullPolicyy, wrong type backoffLimit: "six".
broken="${here}/fixtures/broken"
if kubectl kustomize "${broken}" > "${tmp}/broken.yaml" 2> "${tmp}/err"; then
  check --check=schema "${tmp}/broken.yaml" > "${tmp}/out" 2>&1
  expect_reject "reject fixtures/broken by schema (wrong type)" "${tmp}/out" $? \
    "spec/backoffLimit must be integer"
  check --check=types "${tmp}/broken.yaml" > "${tmp}/out" 2>&1
  expect_reject "reject fixtures/broken by types (unknown fields, wrong type)" "${tmp}/out" $? \
    "'\"replicaz\"' does not exist in type 'IStatefulSetSpec'" \
    "'\"imagePullPolicyy\"' does not exist in type 'IContainer'" \
    "\"backoffLimit\": \"six\".*not assignable to type 'number'"
else
  report 1 "render fixtures/broken" "${tmp}/err"
fi

# reject_edit NAME SED_SCRIPT PATTERN...: the cpu overlay edited by
# SED_SCRIPT must fail the policy check, naming every PATTERN.
reject_edit() {
  local name="$1" script="$2"
  shift 2
  sed "${script}" "${tmp}/overlays_cpu.yaml" > "${tmp}/policy-bad.yaml"
  check --check=policy --overlay=cpu "${tmp}/policy-bad.yaml" > "${tmp}/out" 2>&1
  expect_reject "${name}" "${tmp}/out" $? "$@"
}

# Broken policy: server replicas changed by hand, not via HARRIER_NUM_SHARDS.
reject_edit "reject replicas that disagree with HARRIER_NUM_SHARDS" \
  's/^  replicas: 2$/  replicas: 3/' "StatefulSet replicas 3 != HARRIER_NUM_SHARDS 2"

# Secrets: every pod reads its certificates and token from the Secrets,
# readable through fsGroup only, and the probes avoid the TLS port.
reject_edit "reject pods without fsGroup for the 0440 Secrets" '/^        fsGroup: 65532$/d' \
  "Job/harrier-worker: pod must set fsGroup" "StatefulSet/harrier-server: pod must set fsGroup"
reject_edit "reject world-readable token and key files" \
  's/^\( *\)defaultMode: 288$/\1defaultMode: 292/' \
  "/etc/harrier/secrets/token must not be readable by others (mode 0444)"
reject_edit "reject probes on the TLS port" 's/^\( *\)port: 8081$/\1port: 50051/' \
  "server readinessProbe port 50051 != health port 8081"
reject_edit "reject a job without the token" '/^  HARRIER_AUTH_TOKEN_FILE:/d' \
  "HARRIER_AUTH_TOKEN_FILE not set in harrier-config"

# deploy/k8s/make-secrets.sh: valid Secrets, a certificate every shard
# name matches, signed by the CA it ships.
secrets="${tmp}/secrets"
cert_matches() {
  openssl x509 -in "${secrets}/tls.crt" -noout -checkhost "$1" 2>&1 | grep -q " does match"
}
if "${k8s}/make-secrets.sh" --shards 8 --dir "${secrets}" --namespace demo --san localhost \
     > "${tmp}/secrets.yaml" 2> "${tmp}/err" &&
   check --check=schema "${tmp}/secrets.yaml" >> "${tmp}/err" 2>&1 &&
   check --check=types "${tmp}/secrets.yaml" >> "${tmp}/err" 2>&1 &&
   grep -q '^  name: harrier-tls$' "${tmp}/secrets.yaml" &&
   grep -q '^  name: harrier-token$' "${tmp}/secrets.yaml" &&
   openssl verify -CAfile "${secrets}/ca.crt" "${secrets}/tls.crt" >> "${tmp}/err" 2>&1 &&
   cert_matches harrier-server-0.harrier-server >> "${tmp}/err" &&
   cert_matches harrier-server-7.harrier-server >> "${tmp}/err" &&
   cert_matches harrier-server-1.harrier-server.demo.svc.cluster.local >> "${tmp}/err" &&
   ! cert_matches harrier-server-8.harrier-server >> "${tmp}/err" &&
   ! cert_matches harrier-server-0.evil >> "${tmp}/err"; then
  report 0 "make-secrets.sh: Secrets valid, certificate matches every shard name"
else
  report 1 "make-secrets.sh: Secrets valid, certificate matches every shard name" "${tmp}/err"
fi

# The same files with the real binaries, configured the way the pods are:
# the harrier.env variables (paths moved to the files made above, mode
# 0440 like the mount), mutual TLS and the token. A worker trains 20 steps;
# one without a client certificate is refused.
server_bin="${root}/bazel-bin/server/harrier-server"
worker_bin="${root}/bazel-bin/worker/harrier-worker"
live="live: server and worker with make-secrets.sh's files and harrier.env's TLS/token settings"
if [ ! -x "${server_bin}" ] || [ ! -x "${worker_bin}" ]; then
  echo "SKIP ${live} (not built: bazel build //server:harrier-server //worker:harrier-worker)"
elif [ ! -d /usr/share/datasets/fashion-mnist ]; then
  echo "SKIP ${live} (dataset-fashion-mnist not installed)"
else
  chmod 0440 "${secrets}"/*
  env_for_pod() {  # the harrier.env TLS/token lines, paths moved to ${secrets}
    grep -E '^HARRIER_(TLS_CERT|TLS_KEY|TLS_CA|AUTH_TOKEN_FILE)=' "${k8s}/base/harrier.env" |
      sed "s|=/etc/harrier/secrets/|=${secrets}/|"
  }
  mapfile -t pod_env < <(env_for_pod)
  rm -f "${tmp}/port"
  env "${pod_env[@]}" timeout 120 "${server_bin}" --host=127.0.0.1 --port=0 \
    --port_file="${tmp}/port" --num_workers=1 --health_port=0 > "${tmp}/server.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 1 100); do [ -s "${tmp}/port" ] && break; sleep 0.1; done
  port="$(cat "${tmp}/port" 2>/dev/null || true)"
  worker=(timeout 90 "${worker_bin}" --servers="localhost:${port}" --max_steps=20
          --train_examples=2048 --log_every=10 --connect_timeout_s=10 --rpc_timeout_s=30)
  ok=1
  (
    [ -n "${port}" ] || { echo "server did not start"; cat "${tmp}/server.log"; exit 1; }
    grep -q "tls=mutual token=on" "${tmp}/server.log" || { echo "server not on mutual TLS + token:"; cat "${tmp}/server.log"; exit 1; }
    no_cert=()
    for e in "${pod_env[@]}"; do case "$e" in HARRIER_TLS_CERT=*|HARRIER_TLS_KEY=*) ;; *) no_cert+=("$e") ;; esac; done
    if env "${no_cert[@]}" "${worker[@]}" --connect_timeout_s=3 > "${tmp}/refused.log" 2>&1; then
      echo "a worker without a client certificate was let in"; exit 1
    fi
    env "${pod_env[@]}" "${worker[@]}" > "${tmp}/worker.log" 2>&1 ||
      { echo "worker failed:"; tail -n 20 "${tmp}/worker.log"; exit 1; }
    grep -q '^test_accuracy=' "${tmp}/worker.log" || { echo "no test_accuracy= line"; tail -n 20 "${tmp}/worker.log"; exit 1; }
  ) > "${tmp}/err" 2>&1 && ok=0
  kill "${server_pid}" 2>/dev/null; wait "${server_pid}" 2>/dev/null
  report "${ok}" "${live}" "${tmp}/err"
fi

# yamllint must reject the lint fixture (duplicate key, bare yes).
yamllint -s -c "${here}/yamllint.yaml" "${here}/fixtures/yamllint-bad.yaml" > "${tmp}/out" 2>&1
expect_reject "reject fixtures/yamllint-bad.yaml by yamllint" "${tmp}/out" $? \
  "key-duplicates" "truthy"

finish
