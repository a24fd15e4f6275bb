#!/usr/bin/env bash
# Smoke test of bench/scripts/torch_vs_ddp.sh on a small job: the example
# CNN for 6 steps as 2 workers through harrier.torch (1 shard; the shards'
# optimizer, averaged gradients with each worker's optimizer, and local SGD
# averaging the models every 2 steps) and through PyTorch DDP over gloo (no
# hook, and post-local SGD every 2 steps), every process in its own
# namespace on unshaped veth links. Checks the JSON lines' fields and
# values: the steps run, where the optimizer ran, averaged gradients train
# the model DDP trains and Harrier's local SGD the model DDP's post-local
# SGD trains (the same accuracy), Harrier's client pushed exactly the
# model's float32 gradients each step (under local SGD the model's change
# every second step),
# each worker's link carried at least that much each way for both systems,
# the time to a target reached is a positive number no later than the
# training time and a target never reached is null, and the summary line's
# ratio. Needs root: where namespaces cannot be made it prints SKIPPED with
# the reason and passes.
set -uo pipefail
root="$TEST_SRCDIR/${TEST_WORKSPACE:-harrier}"
tmp="${TEST_TMPDIR:-/tmp}"
passed=0
failed=0
pass() { echo "PASS $1"; passed=$((passed + 1)); }
fail() { echo "FAIL $1"; failed=$((failed + 1)); }
check() { if /usr/bin/python3 -c "$2"; then pass "$1"; else fail "$1"; fi; }

if [ "$(id -u)" != 0 ] || ! ip netns add "hvd-probe$$" 2>"$tmp/probe.err"; then
  echo "SKIPPED: network namespaces cannot be made here: $(cat "$tmp/probe.err" 2>/dev/null)"
  echo "0 passed, 0 failed (skipped)"
  exit 0
fi
ip netns del "hvd-probe$$"

out="$tmp/torch_vs_ddp.jsonl"
err="$tmp/torch_vs_ddp.err"
HARRIER_BIN="$root" OMP_NUM_THREADS=1 timeout 400 "$root/bench/scripts/torch_vs_ddp.sh" \
  --links_gbps=0 --workers=2 --harrier=none@1,none@1@@@average,none@1@@@worker:2 \
  --ddp=none,localsgd:2 --limit_steps=6 --eval_every=3 \
  --targets=0.2,0.99 --out="$out" >/dev/null 2>"$err"
code=$?
if [ "$code" -eq 0 ]; then pass "script exits 0"; else fail "script exits $code"; tail -n 30 "$err"; fi
[ "$(grep -c . "$out")" -eq 6 ] && pass "six JSON lines" || { fail "six JSON lines"; cat "$out"; }

# The example CNN: conv 1->16 and 16->32 (5x5), fc 1568->128, 128->10.
params=$(( (16 * 25 + 16) + (32 * 16 * 25 + 32) + (1568 * 128 + 128) + (128 * 10 + 10) ))
lines="import json; runs = [json.loads(l) for l in open('$out')]; M = 4 * $params"
check "both systems ran 6 steps with positive ms per step and an accuracy in (0, 1)" \
  "$lines; r = [x for x in runs if 'system' in x]
assert [x['system'] for x in r] == ['harrier', 'harrier', 'harrier', 'ddp', 'ddp'], r
assert all(x['steps'] == 6 and x['ms_per_step'] > 0 and 0 < x['test_accuracy'] < 1 for x in r), r"
check "Harrier's client pushed the model's float32 gradients once a step" \
  "$lines; h = runs[:2]; assert all(x['client_bytes_pushed_per_step'] == M for x in h), (h, M)
assert all(x['codec'] == 'none' and x['techniques'] == 'none' and x['shards'] == 1 for x in h), h"
check "local SGD every 2 steps pushed the model's change every second step" \
  "$lines; w = runs[2]; assert w['client_bytes_pushed_per_step'] == M / 2 and w['local_steps'] == 2, (w, M)
assert [x['local_steps'] for x in runs[:5]] == [1, 1, 2, 1, 2], runs"
check "the optimizer ran where each configuration says (the example's own report)" \
  "$lines; assert [x['update'] for x in runs[:3]] == ['server', 'average', 'worker'], runs[:3]"
check "averaged gradients and each worker's optimizer train what DDP trains" \
  "$lines; a, d = runs[1], runs[3]; assert abs(a['test_accuracy'] - d['test_accuracy']) <= 0.002, (a, d)"
check "local SGD through the shards trains what DDP's post-local SGD trains" \
  "$lines; w, d = runs[2], runs[4]; assert abs(w['test_accuracy'] - d['test_accuracy']) <= 0.002, (w, d)"
check "each worker's link carried at least the model each way (Harrier and DDP)" \
  "$lines; r = runs[:2] + runs[3:4]
assert all(x['up_bytes_per_step'] >= M and x['down_bytes_per_step'] >= M for x in r), (r, M)
r = [runs[2], runs[4]]
assert all(x['up_bytes_per_step'] >= M / 2 and x['down_bytes_per_step'] >= M / 2 for x in r), (r, M)
assert all(x['up_bytes_per_step'] < 4 * M for x in runs[:5]), (runs, M)"
check "a target reached has a positive time within the training time, one never reached is null" \
  "$lines; r = runs[:5]
assert all(0 < x['seconds_to_0.2'] <= x['ms_per_step'] * x['steps'] / 1000 + 0.05 for x in r), r
assert all(x['seconds_to_0.99'] is None for x in r), r"
check "the summary compares the bests" \
  "$lines; s = runs[5]; assert s['summary'] and s['links_gbps'] == 0, s
h, d = min(x['ms_per_step'] for x in runs[:3]), min(x['ms_per_step'] for x in runs[3:5])
assert abs(s['harrier_over_ddp_ms_per_step'] - round(h / d, 3)) < 1e-9, s
assert s['harrier_best_seconds_to_0.99'] is None and s['harrier_over_ddp_seconds_to_0.99'] is None, s"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
