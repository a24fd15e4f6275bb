#!/usr/bin/env bash
# The job lifecycle through the real binaries (server/README.md, "Job lifecycle"):
#  A. shards end with their job: 2 shards, 2 workers; once both workers
#     exit, each shard writes a final checkpoint under job-<id>/ (one id
#     for both) and exits 0 by itself (--exit_when_done, the default);
#  B. a worker killed (SIGKILL) mid-training and started again with its
#     rank rejoins at its clock, and the job finishes with its accuracy;
#  C. one cluster (--exit_when_done=false) serves several runs in a row,
#     each a new job id starting at clock 0;
#  D. --resume continues the checkpointed run at its clock; a start
#     without it is a fresh run with a new id, the old one kept aside;
#  E. a worker that fails its own checks takes no rank, and one that fails
#     after taking a rank gives it back: the next worker starts at once.
set -uo pipefail
root="$TEST_SRCDIR/${TEST_WORKSPACE:-harrier}"
server="$root/server/harrier-server"
worker="$root/worker/harrier-worker"
tmp=$TEST_TMPDIR
passed=0
failed=0
pids=()
trap 'kill -KILL "${pids[@]}" 2>/dev/null; wait 2>/dev/null' EXIT
# Waits at most $2 s for process $1, then kills it; returns its exit status.
wait_for() { timeout "$2" tail --pid="$1" -f /dev/null; kill -KILL "$1" 2>/dev/null; wait "$1"; }
check() { if eval "$2"; then echo "PASS $1"; passed=$((passed + 1)); else echo "FAIL $1"; failed=$((failed + 1)); fi; }
# start_server NAME ARGS...: a shard on an ephemeral port; sets $pid and $port.
start_server() {
  local name=$1
  shift
  rm -f "$tmp/$name.port"
  "$server" --host=127.0.0.1 --port=0 --port_file="$tmp/$name.port" "$@" 2>"$tmp/$name.log" &
  pid=$!
  pids+=("$pid")
  for _ in $(seq 300); do [ -s "$tmp/$name.port" ] && break; sleep 0.1; done
  port=$(cat "$tmp/$name.port")
}
job_ids() { sed -n 's/.*event=job_start .*job_id=\([0-9]*\).*/\1/p' "$1" | sort -u | tr '\n' ' '; }
fast=(--train_examples=12000 --batch_size=32 --log_every=10 --epochs=100)

# --- A: two shards end with their job -----------------------------------
start_server a0 --shard=0 --num_shards=2 --num_workers=2 --checkpoint_dir="$tmp/a/ckpt0"
a0=$pid; p0=$port
start_server a1 --shard=1 --num_shards=2 --num_workers=2 --checkpoint_dir="$tmp/a/ckpt1"
a1=$pid; p1=$port
servers="127.0.0.1:$p0,127.0.0.1:$p1"
"$worker" --servers="$servers" --num_workers=2 --rank=0 "${fast[@]}" --max_steps=150 >"$tmp/a.w0.out" 2>"$tmp/a.w0.err" &
w0=$!
"$worker" --servers="$servers" --num_workers=2 --rank=1 "${fast[@]}" --max_steps=150 >"$tmp/a.w1.out" 2>"$tmp/a.w1.err" &
w1=$!
pids+=("$w0" "$w1")
wait_for "$w0" 120; r0=$?
wait_for "$w1" 120; r1=$?
check "A: both workers exit 0 ($r0, $r1)" "[ $r0 -eq 0 ] && [ $r1 -eq 0 ]"
wait_for "$a0" 30; s0=$?
wait_for "$a1" 30; s1=$?
check "A: both shards exit 0 by themselves once the workers are done ($s0, $s1)" "[ $s0 -eq 0 ] && [ $s1 -eq 0 ]"
id0=$(job_ids "$tmp/a0.log"); id1=$(job_ids "$tmp/a1.log")
check "A: one job id on both shards ($id0/$id1)" "[ -n '$id0' ] && [ '$id0' = '$id1' ]"
id=${id0% }
check "A: each shard's final checkpoint is under job-$id/" \
  "ls '$tmp/a/ckpt0/job-$id/shard-0/'*.hck >/dev/null && ls '$tmp/a/ckpt1/job-$id/shard-1/'*.hck >/dev/null"
check "A: the shards say the job is done" "grep -q 'event=job_done shard=0 job_id=$id status=ok' '$tmp/a0.log' && grep -q 'event=job_done shard=1 job_id=$id status=ok' '$tmp/a1.log'"

# --- B: a killed worker rejoins -----------------------------------------
start_server b0 --num_workers=2 --optimizer=nesterov --lr=0.05 --heartbeat_timeout_ms=10000 --rejoin_after_ms=2000
b0=$pid
servers="127.0.0.1:$port"
"$worker" --servers="$servers" --num_workers=2 --rank=0 "${fast[@]}" --max_steps=700 >"$tmp/b.w0.out" 2>"$tmp/b.w0.err" &
w0=$!
"$worker" --servers="$servers" --num_workers=2 --rank=1 "${fast[@]}" --max_steps=700 >"$tmp/b.w1.out" 2>"$tmp/b.w1.err" &
w1=$!
pids+=("$w0" "$w1")
for _ in $(seq 600); do grep -q "step 1[0-9][0-9]/" "$tmp/b.w1.err" && break; sleep 0.1; done
kill -KILL "$w1"
wait "$w1" 2>/dev/null
"$worker" --servers="$servers" --num_workers=2 --rank=1 "${fast[@]}" --max_steps=700 >"$tmp/b.w1b.out" 2>"$tmp/b.w1b.err" &
w1=$!
pids+=("$w1")
wait_for "$w1" 180; r1=$?
wait_for "$w0" 180; r0=$?
check "B: the restarted worker and the other one exit 0 ($r1, $r0)" "[ $r1 -eq 0 ] && [ $r0 -eq 0 ]"
resumed=$(sed -n 's/.*rank 1 resumes at step \([0-9]*\).*/\1/p' "$tmp/b.w1b.err")
check "B: it resumed at its clock (step $resumed), not at 0" "[ -n '$resumed' ] && [ '$resumed' -ge 100 ] && [ '$resumed' -lt 700 ]"
check "B: the shard logged the rejoin" "grep -q 'event=rejoin shard=0 rank=1' '$tmp/b0.log'"
check "B: no worker was lost" "! grep -q 'event=worker_lost' '$tmp/b0.log'"
accuracy=$(sed -n 's/^test_accuracy=//p' "$tmp/b.w0.out")
check "B: rank 0 finishes with its accuracy ($accuracy)" "awk -v a='$accuracy' 'BEGIN { exit !(a > 0.75) }'"
wait_for "$b0" 30
check "B: the shard ends with the job" "[ $? -eq 0 ]"

# --- C: several runs in a row on one cluster -----------------------------
start_server c0 --num_workers=1 --exit_when_done=false
c0=$pid
for run in 1 2 3; do
  "$worker" --servers="127.0.0.1:$port" "${fast[@]}" --max_steps=60 >"$tmp/c.$run.out" 2>"$tmp/c.$run.err"
  rc=$?
  check "C: run $run exits 0 and trains from step 0" "[ $rc -eq 0 ] && ! grep -q resumes '$tmp/c.$run.err' && grep -q '^test_accuracy=' '$tmp/c.$run.out'"
  # The shard's monitor ends the run within 200 ms on a quiet machine: wait
  # for its job_done line before the next run.
  for _ in $(seq 100); do [ "$(grep -c 'event=job_done' "$tmp/c0.log")" -ge "$run" ] && break; sleep 0.1; done
done
ids=$(job_ids "$tmp/c0.log")
check "C: each run had its own job id (${ids})" "[ \$(echo $ids | wc -w) -ge 3 ]"
check "C: the shard is still serving" "kill -0 $c0"
kill -TERM "$c0"; wait_for "$c0" 30

# --- D: --resume versus a fresh run --------------------------------------
dir="$tmp/d/ckpt"
start_server d1 --num_workers=1 --checkpoint_dir="$dir"
d=$pid
"$worker" --servers="127.0.0.1:$port" "${fast[@]}" --max_steps=100 >/dev/null 2>"$tmp/d.1.err"
wait_for "$d" 30
first=$(job_ids "$tmp/d1.log"); first=${first% }
start_server d2 --num_workers=1 --checkpoint_dir="$dir" --resume
d=$pid
"$worker" --servers="127.0.0.1:$port" "${fast[@]}" --max_steps=200 >/dev/null 2>"$tmp/d.2.err"
rc=$?
wait_for "$d" 30
second=$(job_ids "$tmp/d2.log"); second=${second% }
check "D: --resume keeps the job id ($first = $second)" "[ -n '$first' ] && [ '$first' = '$second' ]"
check "D: and the worker goes on at clock 100" "[ $rc -eq 0 ] && grep -q 'rank 0 resumes at step 100 ' '$tmp/d.2.err'"
check "D: the restore is logged" "grep -q 'event=restore shard=0 .* job_id=$first' '$tmp/d2.log'"
start_server d3 --num_workers=1 --checkpoint_dir="$dir"
d=$pid
"$worker" --servers="127.0.0.1:$port" "${fast[@]}" --max_steps=50 >/dev/null 2>"$tmp/d.3.err"
rc=$?
wait_for "$d" 30
third=$(job_ids "$tmp/d3.log"); third=${third% }
check "D: without --resume a fresh run: a new job id ($third), from step 0" "[ $rc -eq 0 ] && [ -n '$third' ] && [ '$third' != '$first' ] && ! grep -q resumes '$tmp/d.3.err'"
check "D: the old run kept aside" "grep -q 'event=fresh_run shard=0 kept_aside=1' '$tmp/d3.log' && ls '$dir/job-$first/shard-0/'*.hck >/dev/null && ls '$dir/job-$third/shard-0/'*.hck >/dev/null"

# --- E: a failing worker holds no rank -----------------------------------
start_server e0 --num_workers=1 --heartbeat_timeout_ms=30000
e0=$pid
"$worker" --servers="127.0.0.1:$port" --batch_size=0 >/dev/null 2>"$tmp/e.1.err"
check "E: --batch_size=0 is refused before registering" "grep -q 'batch_size must be >= 1' '$tmp/e.1.err' && ! grep -q 'event=register' '$tmp/e0.log'"
"$worker" --servers="127.0.0.1:$port" --num_workers=3 >/dev/null 2>"$tmp/e.2.err"
check "E: a --num_workers mismatch fails after registering" "grep -q 'num_workers=3 but the servers expect 1' '$tmp/e.2.err' && grep -q 'event=release shard=0 rank=0' '$tmp/e0.log'"
start=$(date +%s)
"$worker" --servers="127.0.0.1:$port" "${fast[@]}" --max_steps=30 >/dev/null 2>"$tmp/e.3.err"
rc=$?
took=$(( $(date +%s) - start ))
check "E: the next worker gets the rank at once and finishes (exit $rc, $took s)" "[ $rc -eq 0 ] && [ $took -lt 25 ]"
wait_for "$e0" 30
check "E: and the shard ends with it" "[ $? -eq 0 ]"

echo "$passed checks passed, $failed failed"
[ "$failed" -eq 0 ]
