#!/usr/bin/env bash
# End to end through the quickstart launcher: --workload=text runs the
# sparse-embedding example (examples/wordnet_text.py) as 2 workers through
# harrier-launch against 2 real shards, on 20000 glosses for one epoch. It
# must end with the worker's test_accuracy= line (no launcher prefix) well
# above a frozen embedding's 0.13, and no process may outlive it. The full
# run (0.76 with 4 workers) is the README's figure.
set -uo pipefail
root="$TEST_SRCDIR/${TEST_WORKSPACE:-harrier}"
export HARRIER_BIN_DIR="$root"
export TMPDIR="$TEST_TMPDIR"
passed=0
failed=0
check() { if eval "$2"; then echo "PASS $1"; passed=$((passed + 1)); else echo "FAIL $1"; failed=$((failed + 1)); fi; }

if [ ! -e /usr/share/wordnet/data.noun ]; then
  echo "SKIP no wordnet-base (deploy/setup.sh installs it)"
  echo "0 checks passed, 0 failed"
  exit 0
fi
out="$TEST_TMPDIR/quickstart.out"
err="$TEST_TMPDIR/quickstart.err"
timeout 240 "$root/deploy/quickstart.sh" --workload=text --shards=2 --workers=2 --epochs=1 -- \
  --max_train=20000 --cache_dir="$TEST_TMPDIR/cache" >"$out" 2>"$err"
rc=$?
check "quickstart --workload=text exits 0" "[ $rc -eq 0 ]"
[ "$rc" -eq 0 ] || tail -n 30 "$err"
accuracy=$(sed -n 's/^test_accuracy=//p' "$out")
echo "test_accuracy=$accuracy"
check "test accuracy well above a frozen embedding's" "awk -v a='$accuracy' 'BEGIN { exit !(a > 0.5) }'"
check "progress of rank 0 on stderr" "grep -q '^\[worker-0@[^]]*\] wordnet_text: epoch=1 ' '$err'"
check "ms_per_step reported" "grep -q '^ms_per_step=' '$out'"
check "two shards started" "grep -q '^\[launch\] shard-1@.* is up' '$err'"
check "the shards' lines in the log, not on the terminal" \
  "! grep -q '^\[shard-' '$err' && grep -q '^\[shard-1@' '$TEST_TMPDIR'/harrier-quickstart.*/launch.log"
for _ in $(seq 100); do pgrep -f "$root/server/harrier-server|cache_dir=$TEST_TMPDIR/cache" >/dev/null || break; sleep 0.1; done
check "no process left behind" "! pgrep -f '$root/server/harrier-server|cache_dir=$TEST_TMPDIR/cache' >/dev/null"

echo "$passed checks passed, $failed failed"
[ "$failed" -eq 0 ]
