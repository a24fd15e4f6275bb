#!/usr/bin/env bash
# Per-step cost of training through Harrier from PyTorch against plain
# PyTorch: the same CNN, batch and steps (examples/torch_fashion_mnist.py),
# once as one process and once as ONE Harrier worker against ONE shard on
# 127.0.0.1 (the parameter server's whole round trip each step, nothing
# shared with other workers), with and without the comm scheduler.
# Interleaved rounds; one JSON line per run, then one summary line per
# mode with the median ms_per_step and the overhead against single.
#   bench/scripts/torch_overhead.sh [--steps=200] [--batch_size=256] [--rounds=3]
set -euo pipefail
cd "$(dirname "$0")/../.."
steps=200
batch=256
rounds=3
for arg in "$@"; do
  case "$arg" in
    --steps=*) steps=${arg#*=} ;;
    --batch_size=*) batch=${arg#*=} ;;
    --rounds=*) rounds=${arg#*=} ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "torch_overhead: unknown option $arg (see --help)" >&2; exit 2 ;;
  esac
done
bazel build -c opt //server:harrier-server //worker:harrier-worker //python:package >&2
export HARRIER_BIN_DIR
HARRIER_BIN_DIR=$(bazel info -c opt bazel-bin 2>/dev/null)
example=(--limit_steps="$steps" --batch_size="$batch" --log_every=100000)

field() { sed -n "s/^$1=//p" "$2"; }
declare -A times=()
for ((round = 0; round < rounds; round++)); do
  for mode in single harrier harrier_scheduler; do
    out=$(mktemp)
    case "$mode" in
      single) /usr/bin/python3 examples/torch_fashion_mnist.py --mode=single "${example[@]}" >"$out" 2>/dev/null ;;
      harrier) ./deploy/quickstart.sh --workload=torch-cnn --workers=1 --shards=1 -- "${example[@]}" >"$out" 2>/dev/null ;;
      harrier_scheduler) ./deploy/quickstart.sh --workload=torch-cnn --workers=1 --shards=1 -- \
          "${example[@]}" --techniques=all >"$out" 2>/dev/null ;;
    esac
    ms=$(field ms_per_step "$out")
    times[$mode]+="$ms "
    printf '{"bench":"torch_overhead","mode":"%s","round":%d,"steps":%d,"batch_size":%d,"ms_per_step":%s,"test_accuracy":%s,"bytes_pushed":%s}\n' \
      "$mode" "$round" "$steps" "$batch" "$ms" "$(field test_accuracy "$out")" "$(field bytes_pushed "$out" | grep . || echo 0)"
    rm -f "$out"
  done
done
median() { tr ' ' '\n' | grep . | sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
base=$(median <<<"${times[single]}")
for mode in single harrier harrier_scheduler; do
  m=$(median <<<"${times[$mode]}")
  awk -v mode="$mode" -v m="$m" -v b="$base" -v steps="$steps" -v batch="$batch" 'BEGIN {
    printf "{\"bench\":\"torch_overhead\",\"summary\":true,\"mode\":\"%s\",\"steps\":%d,\"batch_size\":%d,\"median_ms_per_step\":%.1f,\"overhead_ms_per_step\":%.1f,\"ratio_to_single\":%.3f}\n",
      mode, steps, batch, m, m - b, m / b }'
done
