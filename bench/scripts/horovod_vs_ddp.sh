#!/usr/bin/env bash
# The Horovod-style example (examples/horovod_style_fashion_mnist.py)
# through Harrier against the same model, data and optimizer under PyTorch
# DistributedDataParallel over gloo (bench/scripts/ddp_fashion_mnist.py),
# N workers on this host (loopback), and as one plain process. Interleaved
# rounds; one JSON line per run (ms_per_step of the training steps,
# test_accuracy), then a summary line per mode with the median and its
# ratio to DDP's. Every process runs with OMP_NUM_THREADS=1 unless the
# caller sets it.
#   bench/scripts/horovod_vs_ddp.sh [--workers=2] [--train_examples=12000] [--rounds=3]
set -euo pipefail
cd "$(dirname "$0")/../.."
workers=2
examples=12000
rounds=3
for arg in "$@"; do
  case "$arg" in
    --workers=*) workers=${arg#*=} ;;
    --train_examples=*) examples=${arg#*=} ;;
    --rounds=*) rounds=${arg#*=} ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "horovod_vs_ddp: unknown option $arg (see --help)" >&2; exit 2 ;;
  esac
done
bazel build -c opt //server:harrier-server //deploy/launch:harrier-launch //python:package >&2
bin=$(bazel info -c opt bazel-bin 2>/dev/null)
export PYTHONPATH="$bin/python/pkg"
# One compute thread per process in every mode: what harrier-launch and
# torchrun give several workers on one host (and what this script's DDP
# processes, started by hand, would get from torchrun).
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
flags=(--epochs=1 --train-examples="$examples" --log-interval=100000)
field() { sed -n "s/^\(\[worker-0@localhost\] \)\{0,1\}$1=//p" "$2" | head -n 1; }
declare -A times=()
modes=(single harrier ddp)
for ((round = 0; round < rounds; round++)); do
  for mode in "${modes[@]}"; do
    out=$(mktemp)
    case "$mode" in
      single) /usr/bin/python3 examples/horovod_style_fashion_mnist.py "${flags[@]}" >"$out" 2>/dev/null ;;
      harrier) "$bin/deploy/launch/harrier-launch" -np "$workers" --base_port=0 -- \
          /usr/bin/python3 examples/horovod_style_fashion_mnist.py "${flags[@]}" >"$out" 2>/dev/null ;;
      ddp) # Debian's torch.distributed.run fails under Python 3.11: the
        # processes are started here, with the variables it would set.
        port=$((20000 + RANDOM % 10000))
        pids=()
        for ((rank = 0; rank < workers; rank++)); do
          MASTER_ADDR=127.0.0.1 MASTER_PORT=$port RANK=$rank WORLD_SIZE=$workers \
            /usr/bin/python3 bench/scripts/ddp_fashion_mnist.py "${flags[@]}" \
            >"$([ $rank -eq 0 ] && echo "$out" || echo /dev/null)" 2>/dev/null &
          pids+=($!)
        done
        wait "${pids[@]}" ;;
    esac
    ms=$(field ms_per_step "$out")
    times[$mode]+="$ms "
    printf '{"bench":"horovod_vs_ddp","mode":"%s","round":%d,"workers":%d,"train_examples":%d,"ms_per_step":%s,"test_accuracy":%s}\n' \
      "$mode" "$round" "$([ "$mode" = single ] && echo 1 || echo "$workers")" "$examples" "$ms" "$(field test_accuracy "$out")"
    rm -f "$out"
  done
done
median() { tr ' ' '\n' | grep . | sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
ddp=$(median <<<"${times[ddp]}")
for mode in "${modes[@]}"; do
  m=$(median <<<"${times[$mode]}")
  awk -v mode="$mode" -v m="$m" -v d="$ddp" -v w="$workers" 'BEGIN {
    printf "{\"bench\":\"horovod_vs_ddp\",\"summary\":true,\"mode\":\"%s\",\"workers\":%d,\"median_ms_per_step\":%.1f,\"ratio_to_ddp\":%.3f}\n",
      mode, (mode == "single") ? 1 : w, m, m / d }'
done
