#!/usr/bin/env bash
# SIGTERM to harrier-worker mid-training: it finishes its step, leaves the
# job and exits 0; the other worker goes on alone and finishes with its
# accuracy (a Leave is not a loss). A signal before training can stop
# cleanly exits at once with 143; so does a second signal.
set -uo pipefail
root="$TEST_SRCDIR/${TEST_WORKSPACE:-harrier}"
server="$root/server/harrier-server"
worker="$root/worker/harrier-worker"
tmp=$TEST_TMPDIR
passed=0
failed=0
# Waits at most $2 s for process $1, then kills it; returns its exit status.
wait_for() { timeout "$2" tail --pid="$1" -f /dev/null; kill -KILL "$1" 2>/dev/null; wait "$1"; }
check() { if eval "$2"; then echo "PASS $1"; passed=$((passed + 1)); else echo "FAIL $1"; failed=$((failed + 1)); fi; }

"$server" --host=127.0.0.1 --port=0 --port_file="$tmp/port" --num_workers=2 \
  --optimizer=nesterov --lr=0.05 --heartbeat_timeout_ms=5000 2>"$tmp/server.log" &
server_pid=$!
pids=("$server_pid")
trap 'kill -KILL "${pids[@]}" 2>/dev/null; wait 2>/dev/null' EXIT
for _ in $(seq 300); do [ -s "$tmp/port" ] && break; sleep 0.1; done
address="127.0.0.1:$(cat "$tmp/port")"

common=(--servers="$address" --num_workers=2 --train_examples=12000 --batch_size=32 --log_every=10 --epochs=100)
"$worker" "${common[@]}" --rank=0 --max_steps=600 >"$tmp/w0.out" 2>"$tmp/w0.err" &
w0=$!
"$worker" "${common[@]}" --rank=1 --max_steps=100000 >"$tmp/w1.out" 2>"$tmp/w1.err" &
w1=$!
pids+=("$w0" "$w1")
# Signal rank 1 once it is training (a progress line at step 20 or later).
for _ in $(seq 300); do grep -q "step [2-9][0-9]/" "$tmp/w1.err" && break; sleep 0.1; done
kill -TERM "$w1"
signalled=$(date +%s.%N)
wait_for "$w1" 30
rc1=$?
took=$(echo "$(date +%s.%N) - $signalled" | bc)
check "signalled worker exits 0" "[ $rc1 -eq 0 ]"
check "it exits within 10 s of the signal (took $took s)" "awk -v t='$took' 'BEGIN { exit !(t < 10) }'"
check "it says it stopped and left" "grep -q 'stopped by signal after [0-9]* steps; left the job' '$tmp/w1.err'"
steps1=$(sed -n 's/.*stopped by signal after \([0-9]*\) steps.*/\1/p' "$tmp/w1.err")
check "it stopped early ($steps1 of 100000 steps)" "[ -n '$steps1' ] && [ '$steps1' -lt 1000 ]"
wait_for "$w0" 120
rc0=$?
check "the other worker finishes alone (exit $rc0)" "[ $rc0 -eq 0 ]"
accuracy=$(sed -n 's/^test_accuracy=//p' "$tmp/w0.out")
check "with its accuracy ($accuracy)" "awk -v a='$accuracy' 'BEGIN { exit !(a > 0.6) }'"
check "the server lost no worker" "! grep -qi 'lost' '$tmp/server.log'"

# Before training can stop cleanly (still connecting): exit at once, 143.
"$worker" --servers=127.0.0.1:1 --connect_timeout_s=30 >/dev/null 2>"$tmp/early.err" &
early=$!
pids+=("$early")
# Once its SIGTERM handler is in (SigCgt bit 15 in /proc), not after a
# fixed sleep a busy machine can outlast.
for _ in $(seq 300); do
  caught=$(awk '/^SigCgt:/ { print $2 }' "/proc/$early/status" 2>/dev/null)
  [ -n "$caught" ] && (( 0x$caught & 0x4000 )) && break
  sleep 0.05
done
kill -TERM "$early"
wait_for "$early" 10
check "a signal while connecting exits 143 at once" "[ $? -eq 143 ] && grep -q 'exiting now' '$tmp/early.err'"

echo "$passed checks passed, $failed failed"
[ "$failed" -eq 0 ]
