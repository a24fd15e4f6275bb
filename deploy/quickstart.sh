#!/usr/bin/env bash
# Harrier's main job: a local cluster on 127.0.0.1 (server shards + workers)
# training on Fashion-MNIST, ending with a line test_accuracy=0.XXXX.
#
#   ./deploy/quickstart.sh [--workload=mlp|cnn|torch-cnn|text] [--shards=2] [--workers=4]
#                          [--epochs=E] [--sync=bsp] [--server_args="..."]
#                          [--straggler_delay_ms=N] [--straggler_probability=P]
#                          [-- extra worker flags]
#
# --workload=mlp (default): the C++ harrier-worker trains an MLP (5 epochs).
# --workload=cnn: the C++ harrier-worker trains the CNN of
# examples/torch_fashion_mnist.py (--workload=cnn, batch 64 per worker:
# global batch 256 with 4 workers, as torch-cnn), 6 epochs, nesterov with
# momentum 0.9 as torch-cnn but lr 0.02 (4 workers: 0.9036 where torch-cnn's
# lr 0.05 gave 0.8981; the C++ trainer does not reshuffle between epochs).
# --workload=torch-cnn: examples/torch_fashion_mnist.py, a PyTorch CNN, one
# /usr/bin/python3 process per worker through the harrier Python package
# (its own default epochs; the servers get its --print_server_args).
# --workload=text: examples/wordnet_text.py, a fastText-style classifier of
# WordNet glosses (Debian's wordnet-base, installed if missing) whose hashed
# word and bigram embedding is a sparse table on the shards, through
# harrier-launch (its own default epochs, 3; 0.76 test accuracy).
#
# Installs what is missing (deploy/setup.sh), builds, starts everything with
# ephemeral ports, streams the workers' progress, and stops every process it
# started when training ends, on Ctrl-C, or when any process fails (then it
# says which one and why, and exits non-zero).
set -euo pipefail
cd "$(dirname "$0")/.."

workload=mlp
shards=2
workers=4
epochs=""
sync=bsp
server_args=""
straggler_delay_ms=0
straggler_probability=1
worker_args=()
while (($#)); do
  case "$1" in
    --workload=*) workload=${1#*=} ;;
    --shards=*) shards=${1#*=} ;;
    --workers=*) workers=${1#*=} ;;
    --epochs=*) epochs=${1#*=} ;;
    --sync=*) sync=${1#*=} ;;
    --server_args=*) server_args=${1#*=} ;;
    --straggler_delay_ms=*) straggler_delay_ms=${1#*=} ;;
    --straggler_probability=*) straggler_probability=${1#*=} ;;
    --) shift; worker_args+=("$@"); break ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "quickstart: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
case "$workload" in
  mlp) epochs=${epochs:-5}; server_args=${server_args:-"--optimizer=nesterov --lr=0.05 --momentum=0.9"} ;;
  cnn)
    epochs=${epochs:-6}; server_args=${server_args:-"--optimizer=nesterov --lr=0.02 --momentum=0.9"}
    worker_args=(--workload=cnn ${worker_args[@]+"${worker_args[@]}"}) ;;
  torch-cnn|text)
    if [ "$straggler_delay_ms" != 0 ]; then
      echo "quickstart: --straggler_delay_ms applies to --workload=mlp and cnn only" >&2; exit 2
    fi ;;
  *) echo "quickstart: unknown workload '$workload' (mlp, cnn, torch-cnn or text)" >&2; exit 2 ;;
esac
for value in "$shards" "$workers" ${epochs:+"$epochs"}; do
  [[ $value =~ ^[1-9][0-9]*$ ]] || { echo "quickstart: counts must be positive integers" >&2; exit 2; }
done

# HARRIER_BIN_DIR: use binaries built elsewhere (tests do) instead of building.
if [ -n "${HARRIER_BIN_DIR:-}" ]; then
  bin=$HARRIER_BIN_DIR
else
  ./deploy/setup.sh
  targets=(//server:harrier-server //worker:harrier-worker)
  [ "$workload" = torch-cnn ] && targets+=(//python:package)
  [ "$workload" = text ] && targets=(//server:harrier-server //python:package //deploy/launch:harrier-launch)
  echo "quickstart: building ${targets[*]}" >&2
  bazel build -c opt "${targets[@]}" >/tmp/harrier-quickstart-build.log 2>&1 ||
    { tail -n 30 /tmp/harrier-quickstart-build.log >&2; echo "quickstart: build failed" >&2; exit 1; }
  bin=$(bazel info -c opt bazel-bin 2>/dev/null)
fi

example=examples/torch_fashion_mnist.py
if [ "$workload" = torch-cnn ]; then
  export PYTHONPATH="$bin/python/pkg${PYTHONPATH:+:$PYTHONPATH}"
  /usr/bin/python3 -c "import harrier, torch" 2>/dev/null ||
    { echo "quickstart: /usr/bin/python3 cannot import harrier and torch (PYTHONPATH=$PYTHONPATH)" >&2; exit 1; }
  # The shards run the example's optimizer: its tuned hyperparameters.
  [ -z "$server_args" ] && server_args=$(/usr/bin/python3 "$example" --print_server_args)
fi

if [ "$workload" = text ]; then
  # The launcher starts the shards and the workers and ends them with the
  # job; its stdout lines carry a "[worker-R@host] " prefix. The shards'
  # lines go to the log only.
  example=examples/wordnet_text.py
  if [ ! -e /usr/share/wordnet/data.noun ]; then
    echo "quickstart: installing wordnet-base (the glosses of examples/wordnet_text.py)" >&2
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO=sudo
    export DEBIAN_FRONTEND=noninteractive
    { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends wordnet-base; } \
      >/dev/null || { echo "quickstart: could not install wordnet-base" >&2; exit 1; }
  fi
  export PYTHONPATH="$bin/python/pkg${PYTHONPATH:+:$PYTHONPATH}"
  /usr/bin/python3 -c "import harrier.torch" 2>/dev/null ||
    { echo "quickstart: /usr/bin/python3 cannot import harrier.torch (PYTHONPATH=$PYTHONPATH)" >&2; exit 1; }
  run_dir=$(mktemp -d "${TMPDIR:-/tmp}/harrier-quickstart.XXXXXX")
  echo "quickstart: $shards shards, $workers text workers ($sync, ${epochs:-default} epochs) through harrier-launch" >&2
  start=$(date +%s.%N)
  status=0
  # shellcheck disable=SC2086
  "$bin/deploy/launch/harrier-launch" -np "$workers" --num_servers="$shards" --base_port=0 \
    --server_bin="$bin/server/harrier-server" --server_args="--sync=$sync $server_args" -- \
    /usr/bin/python3 -u "$example" ${epochs:+--epochs="$epochs"} ${worker_args[@]+"${worker_args[@]}"} \
    >"$run_dir/launch.out" 2> >(tee "$run_dir/launch.log" | grep --line-buffered -v '^\[shard-' >&2) ||
    status=$?
  if [ "$status" -ne 0 ]; then
    echo "quickstart: harrier-launch failed with exit code $status; logs in $run_dir" >&2
    exit 1
  fi
  elapsed=$(echo "$(date +%s.%N) - $start" | bc 2>/dev/null || echo "?")
  echo "quickstart: training finished in ${elapsed} s; logs in $run_dir" >&2
  sed -n 's/^\[worker-0@[^]]*\] //p' "$run_dir/launch.out"
  exit 0
fi

run_dir=$(mktemp -d "${TMPDIR:-/tmp}/harrier-quickstart.XXXXXX")
declare -A name_of=()
pids=()
cleanup() {
  trap - EXIT INT TERM
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  sleep 0.5
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT
trap 'echo "quickstart: interrupted; stopping all processes" >&2; exit 130' INT TERM

start=$(date +%s.%N)
# Servers first; each writes its bound port to a file.
for ((shard = 0; shard < shards; shard++)); do
  # shellcheck disable=SC2086
  "$bin/server/harrier-server" --host=127.0.0.1 --port=0 --port_file="$run_dir/shard$shard.port" \
    --shard="$shard" --num_shards="$shards" --num_workers="$workers" --sync="$sync" $server_args \
    >"$run_dir/shard$shard.log" 2>&1 &
  pids+=($!); name_of[$!]="server shard $shard"
done
servers=""
for ((shard = 0; shard < shards; shard++)); do
  for _ in $(seq 100); do [ -s "$run_dir/shard$shard.port" ] && break; sleep 0.1; done
  if [ ! -s "$run_dir/shard$shard.port" ]; then
    echo "quickstart: server shard $shard did not start:" >&2; tail -n 5 "$run_dir/shard$shard.log" >&2
    exit 1
  fi
  servers+="${servers:+,}127.0.0.1:$(cat "$run_dir/shard$shard.port")"
done
echo "quickstart: $shards shards at $servers; starting $workers $workload workers ($sync, ${epochs:-default} epochs)" >&2

for ((rank = 0; rank < workers; rank++)); do
  if [ "$workload" = torch-cnn ]; then
    # One compute thread per worker unless the caller says otherwise, as
    # harrier-launch and torchrun give several workers on one host.
    OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" /usr/bin/python3 -u "$example" --mode=worker --servers="$servers" --rank="$rank" \
      --num_workers="$workers" ${epochs:+--epochs="$epochs"} ${worker_args[@]+"${worker_args[@]}"} \
      >"$run_dir/worker$rank.out" 2> >(sed -u "s/^/[worker $rank] /" | tee "$run_dir/worker$rank.log" >&2) &
    pids+=($!); name_of[$!]="worker rank $rank"
    continue
  fi
  delay=0
  ((rank == workers - 1)) && delay=$straggler_delay_ms  # the last rank plays the straggler
  "$bin/worker/harrier-worker" --servers="$servers" --rank="$rank" --num_workers="$workers" \
    --epochs="$epochs" --metrics_out="$run_dir/worker$rank.jsonl" --step_delay_ms="$delay" \
    --step_delay_probability="$straggler_probability" \
    ${worker_args[@]+"${worker_args[@]}"} \
    >"$run_dir/worker$rank.out" 2> >(tee "$run_dir/worker$rank.log" >&2) &
  pids+=($!); name_of[$!]="worker rank $rank"
done

# Wait for the workers; any process that exits non-zero stops the job.
remaining=$workers
while ((remaining > 0)); do
  finished=""
  set +e
  wait -n -p finished "${pids[@]}"
  code=$?
  set -e
  [ -z "$finished" ] && continue
  name=${name_of[$finished]}
  kept=()
  for pid in "${pids[@]}"; do [ "$pid" != "$finished" ] && kept+=("$pid"); done
  # A shard ends with its job (--exit_when_done): once every worker has
  # given its rank back, which a worker may do before its last output.
  if [[ $name == server* ]] && [ "$code" -eq 0 ]; then
    pids=("${kept[@]}")
    continue
  fi
  if [ "$code" -ne 0 ] || [[ $name == server* ]]; then
    echo "quickstart: $name (pid $finished) failed with exit code $code:" >&2
    if [[ $name == server* ]]; then tail -n 5 "$run_dir/shard${name##* }.log" >&2
    else tail -n 5 "$run_dir/worker${name##* }.log" >&2; fi
    echo "quickstart: logs in $run_dir" >&2
    exit 1
  fi
  pids=("${kept[@]}")
  remaining=$((remaining - 1))
done

elapsed=$(echo "$(date +%s.%N) - $start" | bc 2>/dev/null || echo "?")
echo "quickstart: training finished in ${elapsed} s; logs and metrics in $run_dir" >&2
cat "$run_dir/worker0.out"
