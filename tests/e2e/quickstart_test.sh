#!/usr/bin/env bash
# End to end through the real binaries: the quickstart launcher trains a
# short run (a subset, a few hundred steps); the loss must fall, accuracy be
# well above chance (0.1), and no process it started may outlive it.
set -euo pipefail
root="$TEST_SRCDIR/${TEST_WORKSPACE:-harrier}"
export HARRIER_BIN_DIR="$root"
export TMPDIR="$TEST_TMPDIR"
failures=0
check() { if eval "$2"; then echo "PASS $1"; else echo "FAIL $1"; failures=$((failures + 1)); fi; }

out="$TEST_TMPDIR/quickstart.out"
"$root/deploy/quickstart.sh" --shards=2 --workers=2 --epochs=1 -- \
  --train_examples=12000 --batch_size=32 --log_every=50 >"$out" 2>"$TEST_TMPDIR/quickstart.err"
rc=$?
check "quickstart exits 0" "[ $rc -eq 0 ]"
accuracy=$(sed -n 's/^test_accuracy=//p' "$out")
echo "test_accuracy=$accuracy"
check "test accuracy well above chance" "awk -v a='$accuracy' 'BEGIN { exit !(a > 0.6) }'"
run_dir=$(ls -d "$TEST_TMPDIR"/harrier-quickstart.* | head -n 1)
mean_loss() { awk -F'"loss":' '{ split($2, a, ","); s += a[1]; n++ } END { if (n) print s / n }'; }
first=$(head -n 20 "$run_dir/worker0.jsonl" | mean_loss)
last=$(tail -n 20 "$run_dir/worker0.jsonl" | mean_loss)
echo "mean loss of the first 20 steps $first, of the last 20 $last"
check "loss falls" "awk -v f='$first' -v l='$last' 'BEGIN { exit !(l < 0.8 * f) }'"
check "progress lines on stderr" "grep -q 'samples/s' '$TEST_TMPDIR/quickstart.err'"
for _ in $(seq 100); do pgrep -f "$root/(server|worker)/harrier-" >/dev/null || break; sleep 0.1; done
check "no process left behind" "! pgrep -f '$root/(server|worker)/harrier-' >/dev/null"

# A worker that fails (its data directory is missing) stops the whole job
# with a non-zero exit that names the failing process.
set +e
"$root/deploy/quickstart.sh" --shards=1 --workers=2 --epochs=1 -- --data_dir=/nonexistent \
  >/dev/null 2>"$TEST_TMPDIR/fail.err"
rc=$?
set -e
check "failing worker fails the job" "[ $rc -ne 0 ]"
check "the failing process is named" "grep -q 'worker rank' '$TEST_TMPDIR/fail.err'"
check "no process left behind after a failure" "! pgrep -f '$root/(server|worker)/harrier-' >/dev/null"

echo "$((6 + 3 - failures)) checks passed, $failures failed"
[ "$failures" -eq 0 ]
