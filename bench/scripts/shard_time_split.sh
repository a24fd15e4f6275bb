#!/usr/bin/env bash
# Where a shard's time per byte goes: receive, check, step, reply.
#
#   bench/scripts/shard_time_split.sh [--transport=grpc|ucx] [--size=16M]
#                                           [--server_binary=PATH] [--bench_binary=PATH]
#                                           [--seconds=4]
#
# Runs `harrier-bench transport` push-pulls (1 shard, 1 worker), samples
# the shard process with `perf record --call-graph dwarf` for --seconds in
# the middle, and files every sample under the first stage its call chain
# names (leaf first; bench/scripts/shard_time_split.py has the
# patterns). Prints one JSON line: the share of the shard's CPU samples per
# stage, and the shard's CPU nanoseconds per byte it received per stage
# (CPU time over the window from /proc/PID/stat, bytes from `ss`'s
# bytes_received of the shard's TCP sockets; with push-pull the shard sends
# as many bytes as it receives). Shared memory moves no TCP bytes: use it
# over gRPC and UCX tcp.
# Needs root or perf_event_paranoid <= 1, and a -c opt build:
#   bazel build -c opt //bench:harrier-bench //server:harrier-server
set -euo pipefail

transport=grpc
size=16M
seconds=4
server_binary=""
bench=""
for arg in "$@"; do
  case "$arg" in
    --transport=*) transport="${arg#*=}" ;;
    --size=*) size="${arg#*=}" ;;
    --seconds=*) seconds="${arg#*=}" ;;
    --server_binary=*) server_binary="${arg#*=}" ;;
    --bench_binary=*) bench="${arg#*=}" ;;
    --help|-h) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown flag $arg (see --help)" >&2; exit 2 ;;
  esac
done

root=$(cd "$(dirname "$0")/../.." && pwd)
[ -n "$bench" ] || bench="$root/bazel-bin/bench/harrier-bench"
[ -x "$bench" ] || { echo "build first: bazel build -c opt //bench:harrier-bench" >&2; exit 2; }
command -v perf >/dev/null || { echo "perf is not installed (apt-get install linux-perf)" >&2; exit 2; }
work=$(mktemp -d)
trap 'pkill -P $$ 2>/dev/null || true; rm -rf "$work"' EXIT

extra=()
[ -n "$server_binary" ] && extra+=("--server_binary=$server_binary")
# Far longer than the window; stopped once the window is over.
"$bench" transport --shards=1 --workers=1 --sizes="$size" --ops=pushpull --skip_tcp \
  --transport="$transport" --bytes_per_point=1024G --min_iterations=1000000 \
  --max_iterations=1000000 "${extra[@]}" >"$work/bench.jsonl" 2>"$work/bench.err" &
bench_pid=$!

server_pid=""
for _ in $(seq 100); do
  server_pid=$(pgrep -n -P "$bench_pid" harrier-server || true)
  [ -n "$server_pid" ] && break
  sleep 0.1
done
[ -n "$server_pid" ] || { cat "$work/bench.err" >&2; echo "no harrier-server started" >&2; exit 1; }
sleep 2  # warm-up and the first timed operations
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
# TCP bytes received on the process's sockets (recvmsg is not in
# /proc/PID/io's rchar).
read_bytes() {
  ss -tinpH 2>/dev/null | awk -v pid="pid=$1," '
    index($0, pid) { mine = 1; next }
    mine { if (match($0, /bytes_received:[0-9]+/)) sum += substr($0, RSTART + 15, RLENGTH - 15) }
    { mine = 0 }
    END { printf "%.0f\n", sum }'
}
before=$(cpu_ticks "$server_pid")
bytes_before=$(read_bytes "$server_pid")
start_ns=$(date +%s%N)
perf record -q -F 499 --call-graph dwarf,16384 -p "$server_pid" -o "$work/perf.data" \
  -- sleep "$seconds" 2>"$work/perf.err" || { cat "$work/perf.err" >&2; exit 1; }
window_ns=$(( $(date +%s%N) - start_ns ))
after=$(cpu_ticks "$server_pid")
bytes_after=$(read_bytes "$server_pid")
kill "$bench_pid" 2>/dev/null || true
wait "$bench_pid" 2>/dev/null || true

perf script -i "$work/perf.data" -F tid,ip,sym 2>/dev/null >"$work/samples.txt"
python3 "$root/bench/scripts/shard_time_split.py" \
  --samples="$work/samples.txt" --bytes=$((bytes_after - bytes_before)) \
  --cpu_seconds="$(python3 -c "print(($after - $before) / $(getconf CLK_TCK))")" \
  --window_seconds="$(python3 -c "print($window_ns / 1e9)")" --transport="$transport" --size="$size"
