#!/usr/bin/env bash
# The replay workload end to end through the real binaries: 2 shards and 2
# workers on 127.0.0.1 replay ResNet-50 (25,557,032 parameters) under BSP
# with SGD. Both workers must print one replay_summary line each with the
# exact check passed and dense traffic: every step pushes and pulls the
# whole model, 4 bytes a parameter each way.
set -uo pipefail
root="${TEST_SRCDIR:-}/${TEST_WORKSPACE:-harrier}"
[ -n "${TEST_SRCDIR:-}" ] || root="${HARRIER_BIN_DIR:?set HARRIER_BIN_DIR outside bazel}"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
server="$root/server/harrier-server"
worker="$root/worker/harrier-worker"
failures=0
checks=0
check() {
  checks=$((checks + 1))
  if eval "$2"; then echo "PASS $1"; else echo "FAIL $1"; failures=$((failures + 1)); fi
}
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; }
trap cleanup EXIT

readonly params=25557032
readonly dense=$((4 * params))

# Starts 2 shards for 2 workers with the given flags, their logs and port
# files in $1; their pids go to the caller's shard_pids and to pids. Waits
# (at most 10 s) for both ports.
start_shards() {
  local dir=$1; shift
  for s in 0 1; do
    "$server" --host=127.0.0.1 --port=0 --port_file="$dir/port$s" --shard=$s --num_shards=2 \
      --num_workers=2 "$@" 2>"$dir/shard$s.log" &
    shard_pids+=($!); pids+=($!)
  done
  for _ in $(seq 300); do [ -s "$dir/port0" ] && [ -s "$dir/port1" ] && break; sleep 0.1; done
}

# One run: 2 fresh shards, 2 workers with the given extra flags, each worker
# bounded by `timeout`. Leaves worker<r>.out/.err in $tmp/$name.
run() {
  local name=$1; shift
  local dir="$tmp/$name"
  mkdir -p "$dir"
  local shard_pids=()
  start_shards "$dir" --sync=bsp --optimizer=sgd --lr=0.0625
  local servers="127.0.0.1:$(cat "$dir/port0"),127.0.0.1:$(cat "$dir/port1")"
  local worker_pids=()
  for r in 0 1; do
    timeout 120 "$worker" --servers="$servers" --rank=$r --workload=replay:resnet50 \
      --compute_scale=0.01 --max_steps=3 --optimizer=sgd --lr=0.0625 --rpc_timeout_s=60 "$@" \
      >"$dir/worker$r.out" 2>"$dir/worker$r.err" &
    worker_pids+=($!)
  done
  local rc=0
  for p in "${worker_pids[@]}"; do wait "$p" || rc=$?; done
  for p in "${shard_pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  echo "$rc" >"$dir/rc"
}

# Pushes the shards served in a run (their "stopped pushes=N" line).
shard_pushes() { grep -h 'stopped pushes=' "$tmp/$1"/shard*.log | sed 's/.*pushes=\([0-9]*\).*/\1/' | awk '{ s += $1 } END { print s + 0 }'; }

field() {  # file, field name: the value in the replay_summary line
  sed -n 's/^replay_summary //p' "$1" | tr ',' '\n' | sed -n "s/^{\{0,1\}\"$2\":\"\{0,1\}\([^\"}]*\)\"\{0,1\}}\{0,1\}$/\1/p"
}

assert_run() {  # name, techniques, bytes a step each way beyond the model's
  local name=$1 techniques=$2 extra=${3:-0} dir="$tmp/$1"
  if [ "$techniques" = none ]; then
    check "$name: no scheduler" "! grep -q 'comm scheduler' '$dir/worker0.err'"
  else
    check "$name: the scheduler with $techniques" "grep -q 'comm scheduler: techniques=$techniques' '$dir/worker0.err'"
  fi
  check "$name: both workers exit 0" "[ $(cat "$dir/rc") -eq 0 ] || { tail -n 3 '$dir'/worker*.err; false; }"
  for r in 0 1; do
    local out="$dir/worker$r.out"
    check "$name: rank $r prints exactly one replay_summary line" \
      "[ \$(grep -c '^replay_summary {' '$out') -eq 1 ] && [ \$(wc -l <'$out') -eq 1 ]"
    echo "  $(cat "$out")"
    check "$name: rank $r model, techniques, rank, workers, shards, steps" \
      "[ '$(field "$out" model)/$(field "$out" techniques)/$(field "$out" rank)/$(field "$out" workers)/$(field "$out" shards)/$(field "$out" steps)/$(field "$out" warmup_steps)' = 'resnet50/$techniques/$r/2/2/3/1' ]"
    check "$name: rank $r checked=true" "[ '$(field "$out" checked)' = true ]"
    check "$name: rank $r pushes 4 x 25,557,032 (+ $extra) bytes a step" \
      "[ '$(field "$out" bytes_pushed_per_iter)' = $((dense + extra)) ]"
    check "$name: rank $r pulls 4 x 25,557,032 (+ $extra) bytes a step" \
      "[ '$(field "$out" bytes_pulled_per_iter)' = $((dense + extra)) ]"
    check "$name: rank $r bytes_per_iter = 2 x (4 x 25,557,032 + $extra)" \
      "[ '$(field "$out" bytes_per_iter)' = $((2 * (dense + extra))) ]"
    # compute at scale 0.01: 213.3 ms x 0.01; a step cannot be shorter.
    check "$name: rank $r compute_ms is the model's at scale 0.01" \
      "awk -v c='$(field "$out" compute_ms)' 'BEGIN { exit !(c > 2.13 && c < 2.14) }'"
    check "$name: rank $r iter_ms at least compute_ms" \
      "awk -v i='$(field "$out" iter_ms)' -v c='$(field "$out" compute_ms)' 'BEGIN { exit !(i >= c) }'"
  done
}

run direct --timeline="$tmp/direct/timeline_{rank}.json"
assert_run direct none
# Without the scheduler the timeline holds the client's operations: the
# first pull of each of ResNet-50's 161 tensors, then a push-pull of each
# in each of the 4 steps.
for r in 0 1; do
  summary=$(python3 - "$tmp/direct/timeline_$r.json" <<'PY' 2>&1
import collections, json, sys
events = json.load(open(sys.argv[1]))
spans = [e for e in events if e.get("ph") == "X"]
pulls = collections.Counter(e["name"] for e in spans if e["cat"] == "pull")
push_pulls = collections.Counter(e["name"] for e in spans if e["cat"] == "push-pull")
lanes = {e["tid"] for e in spans if e["cat"] == "push-pull"}
print(len(pulls), sum(pulls.values()), len(push_pulls), sorted(set(push_pulls.values())),
      len(lanes) > 1)
PY
)
  echo "  direct timeline rank $r: tensors pulled, pulls, tensors push-pulled, times each, lanes > 1 = $summary"
  check "direct: rank $r timeline holds one pull and 4 push-pulls of each of the 161 tensors" \
    "[ '$summary' = '161 161 161 [4] True' ]"
done
# The summary script reads a timeline without steps by operation: a row
# per tensor's push-pulls (4 each) and per first pull (1 each).
python3 "$root/bench/scripts/timeline_summary.py" "$tmp/direct/timeline_0.json" \
  >"$tmp/direct/timeline_summary.txt" 2>&1
head -n 4 "$tmp/direct/timeline_summary.txt"
check "direct: timeline_summary.py prints a row per operation name" \
  "[ \$(grep -cE \"^ +4 .* push-pull of '\" '$tmp/direct/timeline_summary.txt') -eq 161 ] && [ \$(grep -cE \"^ +1 .* pull of '\" '$tmp/direct/timeline_summary.txt') -eq 161 ]"
if [ "${REPLAY_E2E_TECHNIQUES:-all}" != skip ]; then
  run scheduled --techniques=all --timeline="$tmp/scheduled/timeline_{rank}.json"
  # The workers measure the forward-order tail (harrier-worker's default)
  # and agree it through the shards once: one float each way, 4 bytes over
  # the run's 4 steps.
  assert_run scheduled all 1
  tails="$(field "$tmp/scheduled/worker0.out" forward_order_tail) $(field "$tmp/scheduled/worker1.out" forward_order_tail)"
  estimates="$(field "$tmp/scheduled/worker0.out" measured_forward_order_tail) $(field "$tmp/scheduled/worker1.out" measured_forward_order_tail)"
  echo "  forward-order tail planned: $tails; estimates: $estimates"
  check "scheduled: both workers plan the mean of their measured tails" \
    "python3 -c 'import sys; t = [float(x) for x in sys.argv[1].split()]; e = [float(x) for x in sys.argv[2].split()]
sys.exit(0 if t[0] == t[1] and all(0 <= x <= 1 for x in e) and abs(t[0] - sum(e) / 2) < 1e-5 else 1)' '$tails' '$estimates'"
  # Each worker's timeline (a Chrome trace) holds every push and pull of
  # the run: 1 warm-up and 3 timed steps, each pushing the whole model,
  # and a pull of the whole model per step plus the initial one.
  for r in 0 1; do
    timeline="$tmp/scheduled/timeline_$r.json"
    summary=$(python3 - "$timeline" <<'PY' 2>&1
import json, sys
events = json.load(open(sys.argv[1]))
calls = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("push", "pull")]
pushed = sum(e["args"]["bytes"] for e in calls if e["cat"] == "push")
pulled = sum(e["args"]["bytes"] for e in calls if e["cat"] == "pull")
steps = sorted(e["args"]["step"] for e in events if e.get("cat") == "step")
print(pushed, pulled, ",".join(map(str, steps)), len({e["tid"] for e in calls}))
PY
)
    echo "  timeline rank $r: pushed pulled steps lanes = $summary"
    check "scheduled: rank $r timeline holds 4 steps' pushes, 5 pulls of the model, 4 steps" \
      "echo '$summary' | awk '{ exit !(\$1 == $((4 * dense)) && \$2 == $((5 * dense)) && \$3 == \"0,1,2,3\" && \$4 > 2) }'"
  done
  # The summary script reads them: a row per step (0-3, each with the next
  # step's pulls) and the rounds across both workers.
  python3 "$root/bench/scripts/timeline_summary.py" "$tmp/scheduled/timeline_0.json" \
    "$tmp/scheduled/timeline_1.json" >"$tmp/scheduled/timeline_summary.txt" 2>&1
  cat "$tmp/scheduled/timeline_summary.txt"
  check "scheduled: timeline_summary.py prints a row for each of the 4 steps with the rounds" \
    "grep -q 'round_lag_max' '$tmp/scheduled/timeline_summary.txt' && [ \$(grep -cE '^ +[0-3] ' '$tmp/scheduled/timeline_summary.txt') -eq 4 ]"
  # Fusion merges ResNet-50's BN vectors into buckets: fewer pushes reach
  # the shards than the 161 tensors' chunks, so the steps really went
  # through the scheduler.
  direct_pushes=$(shard_pushes direct)
  scheduled_pushes=$(shard_pushes scheduled)
  echo "  resnet50 shard pushes: none $direct_pushes, all $scheduled_pushes"
  check "scheduled: fewer pushes than direct (fusion)" \
    "[ $scheduled_pushes -gt 0 ] && [ $scheduled_pushes -lt $direct_pushes ]"
fi

# The MLP through the scheduler (--techniques=all) ends where the MLP
# without it does: the same test accuracy to the printed digit, under BSP
# from the same seed (tests/integration/scheduler_bsp_test checks the
# parameters bit for bit).
mlp() {  # name, extra worker flags...
  local name=$1; shift
  local dir="$tmp/$name"
  mkdir -p "$dir"
  local shard_pids=()
  start_shards "$dir" --sync=bsp --lr=0.1
  local servers="127.0.0.1:$(cat "$dir/port0"),127.0.0.1:$(cat "$dir/port1")"
  local worker_pids=()
  for r in 0 1; do
    timeout 120 "$worker" --servers="$servers" --rank=$r --train_examples=4000 --max_steps=30 \
      --chunk_kib=64 "$@" >"$dir/worker$r.out" 2>"$dir/worker$r.err" &
    worker_pids+=($!)
  done
  local rc=0
  for p in "${worker_pids[@]}"; do wait "$p" || rc=$?; done
  for p in "${shard_pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  echo "$rc" >"$dir/rc"
}
mlp mlp_none
mlp mlp_all --techniques=all --partition_bytes=65536
none_acc=$(sed -n 's/^test_accuracy=//p' "$tmp/mlp_none/worker0.out")
all_acc=$(sed -n 's/^test_accuracy=//p' "$tmp/mlp_all/worker0.out")
echo "  mlp test_accuracy: none $none_acc, all $all_acc"
check "mlp: both runs exit 0" "[ $(cat "$tmp/mlp_none/rc") -eq 0 ] && [ $(cat "$tmp/mlp_all/rc") -eq 0 ]"
check "mlp: accuracy above chance" "awk -v a='$none_acc' 'BEGIN { exit !(a > 0.3) }'"
check "mlp: --techniques=all reached the trainer's scheduler" \
  "grep -q 'comm scheduler: techniques=all wfbp=1 fusion_bytes=4194304 partition_bytes=65536 priority=1' '$tmp/mlp_all/worker0.err' && ! grep -q 'comm scheduler' '$tmp/mlp_none/worker0.err'"
# Fusion merges the biases and the small last layer into one wire tensor:
# the shards count fewer pushes (their "stopped pushes=N" line), which only
# a trainer that really went through the scheduler produces.
none_pushes=$(shard_pushes mlp_none)
all_pushes=$(shard_pushes mlp_all)
echo "  mlp shard pushes: none $none_pushes, all $all_pushes"
check "mlp: fewer pushes through the scheduler's fusion" "[ $all_pushes -gt 0 ] && [ $all_pushes -lt $none_pushes ]"
check "mlp: the scheduler's run ends where the direct one does" "[ -n '$all_acc' ] && [ '$all_acc' = '$none_acc' ]"

# A wrong learning rate on the workers' side must fail the check, naming a
# tensor, with a non-zero exit (the check is not a formality).
run wrong_lr --lr=0.125
check "wrong lr: the workers exit non-zero" "[ $(cat "$tmp/wrong_lr/rc") -ne 0 ]"
check "wrong lr: the error names a tensor and the check" \
  "grep -q 'replay check: .*\\[' '$tmp/wrong_lr/worker0.err'"
check "wrong lr: no summary line" "! grep -q replay_summary '$tmp/wrong_lr/worker0.out'"

# Unknown model names list the known ones.
"$worker" --servers=127.0.0.1:1 --workload=replay:resnet51 >/dev/null 2>"$tmp/unknown.err"
unknown_rc=$?
check "unknown model: non-zero exit listing the models" \
  "[ $unknown_rc -ne 0 ] && grep -q 'resnet50, vgg16, bert-base' '$tmp/unknown.err'"

echo "$((checks - failures)) checks passed, $failures failed"
[ "$failures" -eq 0 ]
