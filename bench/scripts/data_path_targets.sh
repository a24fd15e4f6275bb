#!/usr/bin/env bash
# The data path's targets, each a ratio measured in one run of this script:
#
#   bench/scripts/data_path_targets.sh [OUT_DIR] [--quick]
#       [--bench_binary=PATH --server_binary=PATH]   (e.g. an older build's)
#
# Runs harrier-bench transport over gRPC, UCX tcp and UCX shared memory
# (1 shard, 1 worker, 4 KiB-64 MiB) and harrier-bench codec at d = 25 M,
# keeps their JSON lines in OUT_DIR (default: a temporary folder), and
# prints one JSON line per target (`"bench":"target"`, the measured value,
# the goal, reached true/false) and a table on stderr.
# --quick: 4 KiB, 1 MiB and 16 MiB only, shorter points (a smoke run).
# Needs a -c opt build: bazel build -c opt //bench:harrier-bench
set -euo pipefail
out=""
quick=0
bench=""
server=()
for arg in "$@"; do
  case "$arg" in
    --quick) quick=1 ;;
    --bench_binary=*) bench="${arg#*=}" ;;
    --server_binary=*) server=("$arg") ;;
    --help|-h) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "unknown flag $arg (see --help)" >&2; exit 2 ;;
    *) out="$arg" ;;
  esac
done
root=$(cd "$(dirname "$0")/../.." && pwd)
[ -n "$bench" ] || bench="$root/bazel-bin/bench/harrier-bench"
[ -x "$bench" ] || { echo "build first: bazel build -c opt //bench:harrier-bench" >&2; exit 2; }
[ -n "$out" ] || out=$(mktemp -d)
mkdir -p "$out"
sizes=4K,1M,16M,64M
points=(--bytes_per_point=256M)
codec_time=0.3
if [ "$quick" = 1 ]; then sizes=4K,1M,16M; points=(--bytes_per_point=64M); codec_time=0.05; fi
common=(transport --shards=1 --workers=1 --sizes="$sizes" "${points[@]}" "${server[@]}")

echo "== gRPC" >&2
"$bench" "${common[@]}" >"$out/grpc.jsonl" 2>"$out/grpc.err"
echo "== UCX tcp" >&2
UCX_TLS=tcp UCX_NET_DEVICES=lo "$bench" "${common[@]}" --transport=ucx \
  >"$out/ucx_tcp.jsonl" 2>"$out/ucx_tcp.err"
echo "== UCX shared memory (UCX_TLS=${HARRIER_SHM_TLS:-sm,self})" >&2
UCX_TLS="${HARRIER_SHM_TLS:-sm,self}" "$bench" "${common[@]}" --transport=ucx \
  >"$out/ucx_shm.jsonl" 2>"$out/ucx_shm.err"
echo "== codecs, d = 25 M" >&2
"$bench" codec --sizes=25000000 --min_time="$codec_time" >"$out/codec.jsonl" 2>"$out/codec.err"
python3 "$root/bench/scripts/data_path_targets.py" --dir="$out" | tee "$out/targets.jsonl"
echo "JSON lines in $out" >&2
