#!/usr/bin/env bash
# The survey's kind of experiment on a local cluster (deploy/quickstart.sh):
#   straggler  4 workers, the last one slowed by --step_delay_ms; throughput and
#              accuracy for BSP, SSP s=1,2,4, ASP, local SGD H=4
#   codecs     4 workers, BSP; accuracy and bytes pushed/pulled per codec
# One JSON line per run on stdout; progress on stderr.
#   bench/scripts/survey_experiments.sh straggler [--epochs=2] [--delay_ms=10]
#       [--probability=1]   (below 1: a transient straggler, delayed on that
#                            fraction of its steps)
#   bench/scripts/survey_experiments.sh jitter --delay_ms=40 [--probability=0.25]
#                                            every worker delayed on random steps
#   bench/scripts/survey_experiments.sh codecs [--epochs=5]
set -euo pipefail
cd "$(dirname "$0")/../.."
what=${1:-}
shift || true
epochs=""
delay_ms=10
probability=1
for arg in "$@"; do
  case "$arg" in
    --epochs=*) epochs=${arg#*=} ;;
    --delay_ms=*) delay_ms=${arg#*=} ;;
    --probability=*) probability=${arg#*=} ;;
    *) echo "unknown option $arg" >&2; exit 2 ;;
  esac
done

# Runs the quickstart; prints "accuracy seconds samples_per_s bytes_pushed bytes_pulled".
run() {
  local log
  log=$(mktemp)
  ./deploy/quickstart.sh "$@" >"$log.out" 2>"$log"
  local dir accuracy seconds rate pushed pulled
  dir=$(sed -n 's/.*logs and metrics in \(.*\)$/\1/p' "$log" | tail -n 1)
  accuracy=$(sed -n 's/^test_accuracy=//p' "$log.out")
  seconds=$(sed -n 's/.*training finished in \([0-9.]*\) s.*/\1/p' "$log")
  # Job throughput: samples trained by all workers over the job's wall time
  # (summing each worker's own rate would overstate it when fast workers
  # finish early).
  local steps
  steps=$(grep -h "done:" "$log" | sed 's/.*done: \([0-9]*\) steps.*/\1/' | awk '{s += $1} END {printf "%.0f", s}')
  rate=$(awk -v n="$steps" -v b=64 -v t="$seconds" 'BEGIN { printf "%d", n * b / t }')
  # And the sum of each worker's own rate while it ran: what SSP/ASP recover
  # (fast workers do not wait), even though the job still ends with the
  # straggler's last step.
  local rate_sum
  rate_sum=$(grep -h "done:" "$log" | sed 's/.*, \([0-9]*\) samples\/s.*/\1/' | awk '{s += $1} END {printf "%.0f", s}')
  pushed=$(for f in "$dir"/worker*.jsonl; do tail -n 1 "$f"; done |
           sed 's/.*"bytes_pushed":\([0-9]*\).*/\1/' | awk '{s += $1} END {printf "%.0f", s}')
  pulled=$(for f in "$dir"/worker*.jsonl; do tail -n 1 "$f"; done |
           sed 's/.*"bytes_pulled":\([0-9]*\).*/\1/' | awk '{s += $1} END {printf "%.0f", s}')
  echo "$accuracy $seconds $rate $pushed $pulled $rate_sum"
  rm -f "$log" "$log.out"
}

case "$what" in
  straggler)
    for mode in "bsp" "ssp 1" "ssp 2" "ssp 4" "asp" "local 4"; do
      set -- $mode
      sync=$1 extra=""
      [ "$sync" = ssp ] && extra="--staleness=$2"
      [ "$sync" = local ] && extra="--local_steps=$2"
      echo "straggler: $mode" >&2
      for delay in 0 "$delay_ms"; do
        read -r acc secs rate pushed pulled rate_sum < <(run --epochs="${epochs:-2}" --sync="$sync" \
          --straggler_delay_ms="$delay" --straggler_probability="$probability" \
          --server_args="--optimizer=momentum --lr=0.05 --momentum=0.9 $extra")
        printf '{"bench":"straggler","sync":"%s","param":"%s","workers":4,"straggler_delay_ms":%s,"delay_probability":%s,"samples_per_s":%s,"worker_rate_sum":%s,"test_accuracy":%s,"seconds":%s}\n' \
          "$sync" "${2:-}" "$delay" "$probability" "$rate" "$rate_sum" "$acc" "$secs"
      done
    done
    ;;
  jitter)
    # Every worker is delayed by --delay_ms on a random --probability of its
    # steps (each worker its own pattern): BSP waits for the slowest worker
    # of every step, SSP absorbs bursts up to s steps.
    [ "$probability" = 1 ] && probability=0.25
    for mode in "bsp" "ssp 1" "ssp 2" "ssp 4" "asp" "local 4"; do
      set -- $mode
      sync=$1 extra=""
      [ "$sync" = ssp ] && extra="--staleness=$2"
      [ "$sync" = local ] && extra="--local_steps=$2"
      echo "jitter: $mode" >&2
      read -r acc secs rate pushed pulled rate_sum < <(run --epochs="${epochs:-2}" --sync="$sync" \
        --server_args="--optimizer=momentum --lr=0.05 --momentum=0.9 $extra" \
        -- --step_delay_ms="$delay_ms" --step_delay_probability="$probability")
      printf '{"bench":"jitter","sync":"%s","param":"%s","workers":4,"delay_ms":%s,"delay_probability":%s,"samples_per_s":%s,"worker_rate_sum":%s,"test_accuracy":%s,"seconds":%s}\n' \
        "$sync" "${2:-}" "$delay_ms" "$probability" "$rate" "$rate_sum" "$acc" "$secs"
    done
    ;;
  codecs)
    for codec in none "topk:ratio=0.01" efsign "qsgd:levels=16" "powersgd:rank=2"; do
      echo "codecs: $codec" >&2
      # Each codec with the server settings tuned for it (a few runs each,
      # see docs/experiments.md). EF-signSGD sends (|p|_1 / d) sign(p), much
      # smaller than g: it gets plain SGD with a large lr, as in Karimireddy
      # et al.; top-k's sparse steps take a larger lr.
      server="--optimizer=nesterov --lr=0.05 --momentum=0.9"
      case "$codec" in
        topk*) server="--optimizer=nesterov --lr=0.08 --momentum=0.9" ;;
        efsign) server="--optimizer=sgd --lr=0.7" ;;
      esac
      read -r acc secs rate pushed pulled rate_sum < <(run --epochs="${epochs:-5}" --server_args="$server" \
        -- --codec="$codec")
      printf '{"bench":"codec_training","codec":"%s","server":"%s","workers":4,"test_accuracy":%s,"bytes_pushed":%s,"bytes_pulled":%s,"seconds":%s}\n' \
        "$codec" "$server" "$acc" "$pushed" "$pulled" "$secs"
    done
    ;;
  *) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac
