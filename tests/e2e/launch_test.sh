#!/usr/bin/env bash
# harrier-launch over real ssh: two "hosts", each a
# network namespace running its own Debian sshd, joined by a bridge in a
# third namespace where the launcher runs. Checks a 2-host job (prefixed
# lines from both shards and both workers, training progress, rank 0's
# accuracy), a failing worker (exit 1 naming it, nothing left running on
# either host), the command form (a script run on both hosts with the job
# in its environment, in the launcher's folder), Ctrl-C and a SIGKILLed
# launcher mid-training (nothing left running), and one-line errors for a
# bad -H, an unreachable host and a missing binary. Needs root and sshd: prints SKIP and passes otherwise.
set -uo pipefail
root="$TEST_SRCDIR/${TEST_WORKSPACE:-harrier}"
launch="$root/deploy/launch/harrier-launch"
tmp=$(mktemp -d "${TEST_TMPDIR:-/tmp}/launch.XXXXXX")
passed=0
failed=0
check() { if eval "$2"; then echo "PASS $1"; passed=$((passed + 1)); else echo "FAIL $1"; failed=$((failed + 1)); fi; }

if [ "$(id -u)" -ne 0 ]; then echo "SKIP: needs root (network namespaces, sshd)"; exit 0; fi
for tool in /usr/sbin/sshd ssh ssh-keygen ip; do
  if ! command -v "$tool" >/dev/null 2>&1; then
    echo "SKIP: no $tool (deploy/setup.sh installs openssh-server openssh-client iproute2)"; exit 0
  fi
done

net=10.198.0
base="hl$$"
br="$base-b"
hosts=("$base-h0" "$base-h1")
addrs=("$net.1" "$net.2")
made=()
bg=()
cleanup() {
  for p in "${bg[@]}"; do kill -KILL "$p" 2>/dev/null; done
  for ns in "${made[@]}"; do
    # Whatever still runs in a namespace (sshd, a leftover process) goes
    # with it, so a failed run leaves nothing behind.
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
  done
  wait 2>/dev/null
  for ns in "${made[@]}"; do ip netns del "$ns" 2>/dev/null; done
}
trap cleanup EXIT
add_ns() { ip netns add "$1" && made+=("$1") && ip -n "$1" link set lo up; }

# The network: a bridge in $br (10.198.0.254, where the launcher runs) and
# one veth into each host namespace.
add_ns "$br" || { echo "FAIL cannot create network namespaces"; exit 1; }
ip -n "$br" link add br0 type bridge
ip -n "$br" addr add "$net.254/24" dev br0
ip -n "$br" link set br0 up
for i in 0 1; do
  add_ns "${hosts[$i]}"
  ip -n "$br" link add "p$i" type veth peer name eth0 netns "${hosts[$i]}"
  ip -n "$br" link set "p$i" master br0
  ip -n "$br" link set "p$i" up
  ip -n "${hosts[$i]}" addr add "${addrs[$i]}/24" dev eth0
  ip -n "${hosts[$i]}" link set eth0 up
done

# Keys and one sshd per host. sshd refuses to start without its privilege
# separation directory.
mkdir -p /run/sshd
ssh-keygen -q -t ed25519 -N '' -f "$tmp/client_key"
cp "$tmp/client_key.pub" "$tmp/authorized_keys"
for i in 0 1; do
  d="$tmp/host$i"
  mkdir -p "$d"
  ssh-keygen -q -t ed25519 -N '' -f "$d/host_key"
  cat >"$d/sshd_config" <<EOF
ListenAddress ${addrs[$i]}
Port 22
HostKey $d/host_key
AuthorizedKeysFile $tmp/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
StrictModes no
UsePAM no
PidFile $d/sshd.pid
LogLevel INFO
EOF
  ip netns exec "${hosts[$i]}" /usr/sbin/sshd -D -f "$d/sshd_config" -E "$d/sshd.log" &
  disown
  bg+=($!)
done
inbr() { ip netns exec "$br" "$@"; }
for i in 0 1; do
  up=no
  for _ in $(seq 100); do
    if inbr timeout 1 bash -c "echo >/dev/tcp/${addrs[$i]}/22" 2>/dev/null; then up=yes; break; fi
    sleep 0.1
  done
  check "sshd answers on ${addrs[$i]}:22" "[ $up = yes ]"
  [ $up = yes ] || { cat "$tmp/host$i/sshd.log"; echo "$passed checks passed, $failed failed"; exit 1; }
done

ssh_args="-i $tmp/client_key -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o BatchMode=yes -o LogLevel=ERROR"
two_hosts="${addrs[0]}:1,${addrs[1]}:1"
# harrier-* processes in host namespace $1 (the pid namespace is shared, so
# pgrep alone would also see other tests' processes).
left_in() { for p in $(ip netns pids "$1"); do cat "/proc/$p/comm" 2>/dev/null; done | grep -c '^harrier-'; }
nothing_left() { [ "$(left_in "${hosts[0]}")" -eq 0 ] && [ "$(left_in "${hosts[1]}")" -eq 0 ]; }
count_logins() { grep -c "Accepted publickey for root from $net.254" "$tmp/host$1/sshd.log"; }

# --dry_run with the default --bin_dir: the binaries next to harrier-launch
# in the Bazel output tree, every process's ssh command line.
inbr "$launch" -H "$two_hosts" --num_servers=2 --ssh_args="$ssh_args" --dry_run -- --max_steps=1 \
  >"$tmp/dry.out" 2>&1
check "dry run prints 4 commands" "[ \$(grep -c ' -- ' '$tmp/dry.out') -eq 4 ]"
check "dry run: shard-1 on host 2, port 50052" \
  "grep '^\[shard-1@${addrs[1]}\] ssh .* ${addrs[1]} -- ' '$tmp/dry.out' | grep -q 'server/harrier-server --shard=1 --num_shards=2 --num_workers=2 --port=50052 --host=0.0.0.0'"
check "dry run: worker-1 gets every shard and its rank" \
  "grep '^\[worker-1@${addrs[1]}\]' '$tmp/dry.out' | grep -q 'worker/harrier-worker --servers=${addrs[0]}:50051,${addrs[1]}:50052 --num_workers=2 --rank=1 --max_steps=1'"

printf '# two hosts\n%s slots=2\n%s:1  # the small one\n' "${addrs[0]}" "${addrs[1]}" >"$tmp/hostfile"
inbr "$launch" --hostfile="$tmp/hostfile" --ssh_args="$ssh_args" --dry_run >"$tmp/dryhf.out" 2>&1
check "hostfile: 2 shards and 3 workers, worker-2 on host 2" \
  "[ \$(grep -c ' -- ' '$tmp/dryhf.out') -eq 5 ] && grep -q '^\[worker-2@${addrs[1]}\] .*--num_workers=3 --rank=2' '$tmp/dryhf.out'"
"$launch" --help >"$tmp/help.out" 2>&1
check "--help exits 0 and describes the teardown" "[ $? -eq 0 ] && grep -q 'tearing down' '$tmp/help.out'"

# A 2-host job: 2 shards, 2 workers, one epoch over 12000 examples.
start=$(date +%s.%N)
inbr timeout 180 "$launch" -H "$two_hosts" --num_servers=2 --grace_ms=3000 --ssh_args="$ssh_args" \
  --server_args="--optimizer=nesterov --lr=0.05" -- --train_examples=12000 --log_every=20 \
  >"$tmp/job.out" 2>"$tmp/job.err"
rc=$?
took=$(echo "$(date +%s.%N) - $start" | bc)
check "2-host job exits 0 (took $took s)" "[ $rc -eq 0 ]"
[ $rc -eq 0 ] || tail -n 30 "$tmp/job.err"
for tag in "shard-0@${addrs[0]}" "shard-1@${addrs[1]}" "worker-0@${addrs[0]}" "worker-1@${addrs[1]}"; do
  check "lines prefixed [$tag]" "grep -q '^\[$tag\] ' '$tmp/job.err'"
done
check "shard-1 says it serves shard 1 of 2" "grep -q '^\[shard-1@${addrs[1]}\] .*serving shard=1/2 port=50052 workers=2' '$tmp/job.err'"
check "worker-1 shows training progress" "grep -q '^\[worker-1@${addrs[1]}\] \[worker 1\] epoch 0 step [0-9]*/' '$tmp/job.err'"
check "worker-1 finishes" "grep -q '^\[worker-1@${addrs[1]}\] \[worker 1\] done: ' '$tmp/job.err'"
accuracy=$(sed -n "s/^\[worker-0@${addrs[0]}\] test_accuracy=//p" "$tmp/job.out")
# Measured here: 0.8137 in each of 4 runs (BSP, fixed seed); 0.7 leaves room and fails an
# untrained model (0.1).
check "rank 0's test_accuracy ($accuracy) > 0.7" "awk -v a='${accuracy:-0}' 'BEGIN { exit !(a > 0.7) }'"
check "every line is prefixed" "! grep -v '^\[\(shard-[01]\|worker-[01]\)@$net\.[12]\] \|^\[launch\] ' '$tmp/job.out' '$tmp/job.err' | grep -q ."
check "launcher reports success" "grep -q '^\[launch\] job finished: every worker exited 0' '$tmp/job.err'"
check "processes started over ssh (logins on host 1: $(count_logins 0), host 2: $(count_logins 1))" \
  "[ $(count_logins 0) -ge 3 ] && [ $(count_logins 1) -ge 3 ]"
check "nothing left running after the job" nothing_left

# A failing worker: --batch_size=0 makes harrier-worker exit 1.
inbr timeout 120 "$launch" -H "$two_hosts" --num_servers=2 --grace_ms=3000 --ssh_args="$ssh_args" \
  -- --batch_size=0 --train_examples=12000 >"$tmp/fail.out" 2>"$tmp/fail.err"
rc=$?
check "a failing worker: launcher exits 1 (got $rc)" "[ $rc -eq 1 ]"
check "it names the failed worker" \
  "grep -q '^\[launch\] worker-[01]@$net\.[12] exited with status 1: tearing down$' '$tmp/fail.err'"
check "the worker's own error is shown" "grep -q '^\[worker-[01]@$net\.[12]\] harrier-worker: --batch_size must be >= 1' '$tmp/fail.err'"
check "nothing left running after the failure" nothing_left
[ "$(tail -n 1 "$tmp/fail.err")" = "[launch] job failed" ] || tail -n 20 "$tmp/fail.err"

# The command form on both hosts: a script run by its relative path from
# the launcher's folder (the hosts share this file system), each rank with
# the job in its environment, in that folder.
mkdir -p "$tmp/job"
cat >"$tmp/job/show_env.sh" <<'EOF'
#!/bin/sh
echo "rank=$HARRIER_RANK of $HARRIER_NUM_WORKERS local=$HARRIER_LOCAL_RANK/$HARRIER_LOCAL_SIZE shards=$HARRIER_NUM_SHARDS servers=$HARRIER_SERVERS pwd=$(pwd)"
EOF
chmod +x "$tmp/job/show_env.sh"
(cd "$tmp/job" && inbr timeout 60 "$launch" -H "$two_hosts" --num_servers=2 --grace_ms=1000 --ssh_args="$ssh_args" \
  -- ./show_env.sh) >"$tmp/cmd.out" 2>"$tmp/cmd.err"
rc=$?
check "command form on 2 hosts exits 0 (got $rc)" "[ $rc -eq 0 ]"
[ $rc -eq 0 ] || tail -n 20 "$tmp/cmd.err"
for r in 0 1; do
  check "command form: worker-$r@${addrs[$r]} has rank $r, both shards, the launcher's folder" \
    "grep -qxF '[worker-$r@${addrs[$r]}] rank=$r of 2 local=0/1 shards=2 servers=${addrs[0]}:50051,${addrs[1]}:50052 pwd=$tmp/job' '$tmp/cmd.out'"
done
check "command form: the launcher reports success" "grep -q '^\[launch\] job finished: every worker exited 0$' '$tmp/cmd.err'"
check "command form: nothing left running" nothing_left
# A failing command on host 2 while rank 0 on host 1 runs a child of its
# own: the remote wrapper ends rank 0's whole process group.
(cd "$tmp/job" && inbr timeout 60 "$launch" -H "$two_hosts" --num_servers=2 --grace_ms=3000 --ssh_args="$ssh_args" \
  -- sh -c 'if [ "$HARRIER_RANK" = 1 ]; then
              for _ in $(seq 200); do [ -s child0 ] && break; sleep 0.1; done; exit 3
            fi
            echo $$ >pid0; sleep 300 & echo $! >child0; wait') >"$tmp/cmdfail.out" 2>"$tmp/cmdfail.err"
rc=$?
check "command form: a failing command, launcher exits 1 (got $rc)" \
  "[ $rc -eq 1 ] && grep -qx '\[launch\] worker-1@${addrs[1]} exited with status 3: tearing down' '$tmp/cmdfail.err'"
rank0_pids="$(cat "$tmp/job/pid0" "$tmp/job/child0" 2>/dev/null | tr '\n' ' ')"
gone() { [ ! -e "/proc/$1" ] || grep -q '^State:.*Z' "/proc/$1/status" 2>/dev/null; }
ended=no
for _ in $(seq 50); do
  left=no
  for p in $rank0_pids; do gone "$p" || left=yes; done
  [ $left = no ] && { ended=yes; break; }
  sleep 0.1
done
check "command form: rank 0 on host 1 and its child (pids $rank0_pids) ended" "[ -n '$rank0_pids' ] && [ $ended = yes ]"
check "command form: nothing left running after the failure" nothing_left

(cd "$tmp/job" && inbr timeout 60 "$launch" -H "$two_hosts" --ssh_args="$ssh_args" -- ./missing.sh) \
  >/dev/null 2>"$tmp/cmdmissing.err"
rc=$?
check "command form: a command path missing on a host is named before anything starts (exit $rc)" \
  "[ $rc -eq 1 ] && grep -qx '\[launch\] ${addrs[0]}: no executable ./missing.sh (see --bin_dir, --server_bin and the command after --)' '$tmp/cmdmissing.err'"

# Ctrl-C mid-training, then a SIGKILLed launcher: a long job, signalled once
# a worker is past step 20.
long=(--train_examples=12000 --epochs=1000 --max_steps=1000000 --log_every=10)
run_long() {  # name
  # Not through inbr: $! must be the launcher itself (ip netns exec execs
  # it), not a subshell running a function.
  ip netns exec "$br" "$launch" -H "$two_hosts" --num_servers=2 --grace_ms=5000 --ssh_args="$ssh_args" \
    -- "${long[@]}" >"$tmp/$1.out" 2>"$tmp/$1.err" &
  pid=$!
  bg+=("$pid")
  training=no
  for _ in $(seq 600); do
    if grep -q '^\[worker-1@[^]]*\] \[worker 1\] epoch [0-9]* step \([2-9][0-9]\|[0-9][0-9][0-9]\+\)/' "$tmp/$1.err"; then
      training=yes; break
    fi
    sleep 0.1
  done
  check "$1: training started" "[ $training = yes ]"
  check "$1: harrier processes run in both namespaces" \
    "[ \$(left_in ${hosts[0]}) -ge 2 ] && [ \$(left_in ${hosts[1]}) -ge 2 ]"
}
run_long sigint
kill -INT "$pid"
signalled=$(date +%s.%N)
timeout 30 tail --pid="$pid" -f /dev/null
kill -KILL "$pid" 2>/dev/null
wait "$pid"
rc=$?
took=$(echo "$(date +%s.%N) - $signalled" | bc)
check "sigint: launcher exits non-zero (got $rc)" "[ $rc -ne 0 ]"
check "sigint: within --grace_ms + 5 s (took $took s)" "awk -v t='$took' 'BEGIN { exit !(t < 10) }'"
check "sigint: it says so" "grep -q '^\[launch\] signal 2 received: tearing down$' '$tmp/sigint.err'"
check "sigint: nothing left running" nothing_left
# Workers get SIGTERM before their shards, so they leave the job cleanly.
check "sigint: SIGTERM was enough (no SIGKILL)" "! grep -q 'sending SIGKILL' '$tmp/sigint.err'"
check "sigint: worker-1 left the job" "grep -q '^\[worker-1@${addrs[1]}\] .*stopped by signal after [0-9]* steps; left the job' '$tmp/sigint.err'"

# SIGKILL: the launcher cannot clean up; its ssh clients lose their stdin,
# and the remote wrappers stop their processes.
run_long sigkill
{ kill -KILL "$pid"; wait "$pid"; } 2>/dev/null
gone=no
for _ in $(seq 150); do nothing_left && { gone=yes; break; }; sleep 0.1; done
check "sigkill: remote processes end within 15 s" "[ $gone = yes ]"

# One-line errors.
inbr timeout 10 "$launch" -H "${addrs[0]}:0" -- --max_steps=1 >/dev/null 2>"$tmp/badh.err"
rc=$?
check "bad -H is refused with one line (exit $rc)" \
  "[ $rc -eq 2 ] && [ \$(wc -l <'$tmp/badh.err') -eq 1 ] && grep -q 'slots of ${addrs[0]} must be a positive integer' '$tmp/badh.err'"
inbr timeout 10 "$launch" -H "${addrs[0]}" >/dev/null 2>"$tmp/noslots.err"
check "-H without slots is refused" "grep -q \"'${addrs[0]}' has no slots\" '$tmp/noslots.err'"
inbr timeout 60 "$launch" -H "$net.9:1" --ssh_args="$ssh_args -o ConnectTimeout=3" -- --max_steps=1 \
  >/dev/null 2>"$tmp/unreach.err"
rc=$?
check "an unreachable host is named with ssh's message (exit $rc)" \
  "[ $rc -eq 1 ] && grep -q '^\[launch\] cannot reach host $net.9 over ssh: ssh: connect to host $net.9 port 22: ' '$tmp/unreach.err'"
inbr timeout 60 "$launch" -H "$two_hosts" --ssh_args="$ssh_args" --worker_bin=/nonexistent/harrier-worker \
  -- --max_steps=1 >/dev/null 2>"$tmp/nobin.err"
rc=$?
check "a missing binary is named (exit $rc)" \
  "[ $rc -eq 1 ] && grep -q '^\[launch\] ${addrs[0]}: no executable /nonexistent/harrier-worker' '$tmp/nobin.err'"
check "nothing left running at the end" nothing_left

echo "$passed checks passed, $failed failed"
[ "$failed" -eq 0 ]
