#!/usr/bin/env bash
# End to end through the quickstart launcher: --workload=torch-cnn runs the
# PyTorch example (examples/torch_fashion_mnist.py) as 2 worker processes
# through the harrier Python package against 2 real shards, for a short run
# (200 steps of a 64-image global batch). It must end with test_accuracy=
# well above chance, every worker must see the same rank-0 start, and no
# process may outlive it. The full run (0.90) is the README's figure.
set -uo pipefail
root="$TEST_SRCDIR/${TEST_WORKSPACE:-harrier}"
export HARRIER_BIN_DIR="$root"
export TMPDIR="$TEST_TMPDIR"
passed=0
failed=0
check() { if eval "$2"; then echo "PASS $1"; passed=$((passed + 1)); else echo "FAIL $1"; failed=$((failed + 1)); fi; }

out="$TEST_TMPDIR/quickstart.out"
err="$TEST_TMPDIR/quickstart.err"
timeout 400 "$root/deploy/quickstart.sh" --workload=torch-cnn --shards=2 --workers=2 -- \
  --limit_steps=200 --batch_size=64 --log_every=50 >"$out" 2>"$err"
rc=$?
check "quickstart --workload=torch-cnn exits 0" "[ $rc -eq 0 ]"
[ "$rc" -eq 0 ] || tail -n 30 "$err"
accuracy=$(sed -n 's/^test_accuracy=//p' "$out")
echo "test_accuracy=$accuracy"
check "test accuracy well above chance" "awk -v a='$accuracy' 'BEGIN { exit !(a > 0.6) }'"
check "the shards ran the example's optimizer" "grep -q 'optimizer=nesterov' '$TEST_TMPDIR'/harrier-quickstart.*/shard0.log"
check "progress of both workers on stderr" "grep -q '^\[worker 1\].*step=' '$err' && grep -q '^\[worker 0\].*step=' '$err'"
check "ms_per_step reported" "grep -q '^ms_per_step=' '$out'"
for _ in $(seq 100); do pgrep -f "$root/(server/harrier-server|examples/torch_fashion_mnist)" >/dev/null || break; sleep 0.1; done
check "no process left behind" "! pgrep -f '$root/(server/harrier-server|examples/torch_fashion_mnist)' >/dev/null"

echo "$passed checks passed, $failed failed"
[ "$failed" -eq 0 ]
