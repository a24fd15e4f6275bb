#!/usr/bin/env bash
# harrier-launch's command form on this host, for real (no ssh): shards
# started on free ports, then `harrier-launch -np 2 -- sh -c ...` printing
# the HARRIER_* environment of each rank; a command failing on rank 1 (the
# launcher names it, exits 1 and leaves nothing running, the other rank's
# children included); harrier-worker run as the command, configured by the
# environment alone, against a shard serving mutual TLS with the job token.
set -uo pipefail
root="$TEST_SRCDIR/${TEST_WORKSPACE:-harrier}"
launch="$root/deploy/launch/harrier-launch"
worker="$root/worker/harrier-worker"
tmp=$(mktemp -d "${TEST_TMPDIR:-/tmp}/launch_command.XXXXXX")
passed=0
failed=0
check() {  # name, condition (evaluated); on failure the job's last lines
  if eval "$2"; then
    echo "PASS $1"; passed=$((passed + 1))
  else
    echo "FAIL $1"; failed=$((failed + 1))
    tail -n 15 "$tmp/$job.out" "$tmp/$job.err" 2>/dev/null | sed 's/^/    /'
  fi
}
mkdir -p "$tmp/work"

port_answers() { timeout 1 bash -c "echo >/dev/tcp/127.0.0.1/$1" 2>/dev/null; }
# run_job NAME LAUNCHER_ARGS...: harrier-launch from $tmp/work with shards
# on a base port picked at random away from the ephemeral range; another
# port when one answers already or a shard could not listen (taken
# meanwhile). Sets $port and $rc; output in $tmp/NAME.out and .err.
run_job() {
  job=$1
  shift
  for _ in 1 2 3 4 5; do
    port=$((20000 + RANDOM % 9990))
    if port_answers "$port" || port_answers $((port + 1)); then continue; fi
    (cd "$tmp/work" && timeout 120 "$launch" --base_port="$port" --grace_ms=1000 "$@") \
      >"$tmp/$job.out" 2>"$tmp/$job.err"
    rc=$?
    grep -q 'cannot listen on .*: in use' "$tmp/$job.err" || return 0
  done
}
# Shards of the last job still running (their command lines name the port).
shards_left() { pgrep -f "harrier-server .*--port=($port|$((port + 1))) " >/dev/null; }
# gone PID: not running (a zombie not yet reaped by its new parent counts).
gone() { [ ! -e "/proc/$1" ] || grep -q '^State:.*Z' "/proc/$1/status" 2>/dev/null; }
# all_gone PID...: within 5 s.
all_gone() {
  local p left
  for _ in $(seq 50); do
    left=no
    for p in "$@"; do gone "$p" || left=yes; done
    [ $left = no ] && return 0
    sleep 0.1
  done
  return 1
}

# 1. Two ranks, two shards: each rank's line carries its environment.
run_job env -np 2 --num_servers=2 -- sh -c \
  'echo "rank=$HARRIER_RANK local_rank=$HARRIER_LOCAL_RANK local_size=$HARRIER_LOCAL_SIZE workers=$HARRIER_NUM_WORKERS shards=$HARRIER_NUM_SHARDS servers=$HARRIER_SERVERS tls=${HARRIER_TLS_CA:-none} pwd=$(pwd)"'
servers="127.0.0.1:$port,127.0.0.1:$((port + 1))"
check "the job exits 0 (got $rc)" "[ $rc -eq 0 ]"
for r in 0 1; do
  check "worker-$r's line: rank $r of 2, local rank $r of 2, both shards, the launcher's folder" \
    "grep -qxF '[worker-$r@localhost] rank=$r local_rank=$r local_size=2 workers=2 shards=2 servers=$servers tls=none pwd=$tmp/work' '$tmp/env.out'"
done
check "one line per rank on stdout, nothing else" "[ \$(wc -l <'$tmp/env.out') -eq 2 ]"
check "both shards came up before the ranks ran" \
  "grep -q '^\[launch\] shard-1@localhost is up on port $((port + 1))$' '$tmp/env.err'"
check "the launcher reports success" "grep -q '^\[launch\] job finished: every worker exited 0$' '$tmp/env.err'"
check "no shard left running" "! shards_left"

# --base_port=0: the launcher picks a free port for the shard.
job=free
(cd "$tmp/work" && timeout 60 "$launch" -np 1 --base_port=0 --grace_ms=1000 -- sh -c 'echo "servers=$HARRIER_SERVERS"') \
  >"$tmp/free.out" 2>"$tmp/free.err"
rc=$?
free_port=$(sed -n 's/^\[launch\] shard-0@localhost is up on port \([0-9]*\)$/\1/p' "$tmp/free.err")
check "--base_port=0: exit 0 (got $rc), the command sees the port the shard listens on ($free_port)" \
  "[ $rc -eq 0 ] && [ -n '$free_port' ] && grep -qx '\[worker-0@localhost\] servers=127.0.0.1:$free_port' '$tmp/free.out'"

# 2. Rank 1 fails (exit 3) once rank 0 runs a child of its own: the launcher
# names worker-1, exits 1, and rank 0, its child and the shard all end.
run_job fail -np 2 -- sh -c '
  if [ "$HARRIER_RANK" = 1 ]; then
    for _ in $(seq 200); do [ -s child0 ] && break; sleep 0.1; done
    echo "rank 1 fails"; exit 3
  fi
  echo $$ >pid0; sleep 300 & echo $! >child0; wait'
check "a failing command: launcher exits 1 (got $rc)" "[ $rc -eq 1 ]"
check "it names worker-1 and its status" \
  "grep -qx '\[launch\] worker-1@localhost exited with status 3: tearing down' '$tmp/fail.err'"
check "rank 1's own line is shown" "grep -qx '\[worker-1@localhost\] rank 1 fails' '$tmp/fail.out'"
check "the launcher's last line says the job failed" "[ \"\$(tail -n 1 '$tmp/fail.err')\" = '[launch] job failed' ]"
pids="$(cat "$tmp/work/pid0" "$tmp/work/child0" 2>/dev/null | tr '\n' ' ')"
check "rank 0 and its child (pids $pids) are gone" "[ -n '$pids' ] && all_gone $pids"
check "no shard left running after the failure" "! shards_left"

# 3. harrier-worker as the command, configured by the HARRIER_* variables
# alone (no flags), against a shard serving mutual TLS with the job token;
# the launcher's readiness check (a TCP connect) passes a TLS shard.
data_dir=/usr/share/datasets/fashion-mnist
if ! command -v openssl >/dev/null 2>&1 || [ ! -d "$data_dir" ]; then
  echo "SKIP TLS job (needs openssl and dataset-fashion-mnist)"
else
  (cd "$tmp/work" &&
   openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout tls.key \
     -out tls.crt -days 2 -subj /CN=localhost -addext subjectAltName=IP:127.0.0.1,DNS:localhost \
     >/dev/null 2>&1 &&
   head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >token && chmod 0600 token tls.key)
  run_job tls -np 1 --tls_ca=tls.crt --tls_cert=tls.crt --tls_key=tls.key --auth_token_file=token \
    -- "$worker" --max_steps=5 --train_examples=1024 --log_every=5
  check "TLS job exits 0 (got $rc)" "[ $rc -eq 0 ]"
  check "the shard serves mutual TLS with the token" \
    "grep -q '^\[shard-0@localhost\] .*serving shard=0/1 port=$port .*tls=mutual token=on' '$tmp/tls.err'"
  check "the readiness check saw the TLS shard up" "grep -qx '\[launch\] shard-0@localhost is up on port $port' '$tmp/tls.err'"
  check "harrier-worker, given no flags, trained and evaluated as rank 0" \
    "grep -q '^\[worker-0@localhost\] test_accuracy=0\.[0-9]*$' '$tmp/tls.out'"
  check "the shard ended with its job (no SIGTERM needed)" \
    "! grep -q 'shards still running' '$tmp/tls.err' && grep -q 'every worker finished' '$tmp/tls.err'"
  check "no shard left running after the TLS job" "! shards_left"
fi

echo "$passed checks passed, $failed failed"
[ "$failed" -eq 0 ]
