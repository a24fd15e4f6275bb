#!/usr/bin/env bash
# harrier-launch's flags through the real binary, with --dry_run (no ssh
# needed): -H's and -np's spellings, a flagfile, HARRIER_<NAME> variables
# and their precedence, a command after -- with its environment, the TLS and
# token flags passed on, --help, one-line errors.
set -uo pipefail
root="$TEST_SRCDIR/${TEST_WORKSPACE:-harrier}"
launch="$root/deploy/launch/harrier-launch"
tmp="$TEST_TMPDIR"
failures=0
total=0
report() {  # name, ok?, detail
  total=$((total + 1))
  if [ "$2" = yes ]; then echo "PASS $1"; else echo "FAIL $1: $3"; failures=$((failures + 1)); fi
}
# The launcher in an environment of only PATH and the given NAME=value.
run() { env -i PATH="$PATH" "$@" >"$tmp/out" 2>"$tmp/err"; }
commands() { sed 's/^\[[^]]*\] //' "$tmp/out"; }  # the command lines, without prefixes

run "$launch" -H localhost:2 --bin_dir=/opt/h --dry_run -- --max_steps=1
rc=$?
commands >"$tmp/expected"
report "-H LIST: a shard and two workers, worker flags after --" \
  "$([ $rc -eq 0 ] && [ "$(wc -l <"$tmp/out")" -eq 3 ] &&
     grep -qx '/opt/h/harrier-worker --servers=127.0.0.1:50051 --num_workers=2 --rank=1 --max_steps=1' "$tmp/expected" &&
     echo yes)" "exit $rc: $(head -c 300 "$tmp/out" "$tmp/err")"
for spelling in "-Hlocalhost:2" "-H=localhost:2" "--hosts=localhost:2" "--hosts localhost:2"; do
  # shellcheck disable=SC2086
  run "$launch" $spelling --bin_dir=/opt/h --dry_run -- --max_steps=1
  report "'$spelling' means the same" "$(commands | cmp -s - "$tmp/expected" && echo yes)" \
    "$(head -c 300 "$tmp/out" "$tmp/err")"
done

# -np N alone is localhost:N, in every spelling.
for spelling in "-np 2" "-np2" "-np=2" "--np=2" "--np 2"; do
  # shellcheck disable=SC2086
  run "$launch" $spelling --bin_dir=/opt/h --dry_run -- --max_steps=1
  report "'$spelling' alone means -H localhost:2" "$(commands | cmp -s - "$tmp/expected" && echo yes)" \
    "$(head -c 300 "$tmp/out" "$tmp/err")"
done
run HARRIER_NP=2 "$launch" --bin_dir=/opt/h --dry_run -- --max_steps=1
report "HARRIER_NP=2 is -np 2" "$(commands | cmp -s - "$tmp/expected" && echo yes)" \
  "$(head -c 300 "$tmp/out" "$tmp/err")"
run "$launch" -np 1 -H localhost:2 --bin_dir=/opt/h --dry_run -- --max_steps=1
report "-np 1 -H localhost:2: one worker of one" \
  "$([ "$(wc -l <"$tmp/out")" -eq 2 ] &&
     grep -qx '\[worker-0@localhost\] /opt/h/harrier-worker --servers=127.0.0.1:50051 --num_workers=1 --rank=0 --max_steps=1' "$tmp/out" &&
     grep -q -- '--num_shards=1 --num_workers=1 ' "$tmp/out" && echo yes)" "$(head -c 300 "$tmp/out" "$tmp/err")"
# With remote hosts (not contacted by --dry_run): ranks fill a, then b; c is
# not used (no shard there either).
run "$launch" -np 3 -H a:2,b:2,c:1 --bin_dir=/opt/h --dry_run -- --max_steps=1
report "-np 3 -H a:2,b:2,c:1: workers 0 and 1 on a, 2 on b, shards on a and b only" \
  "$([ "$(wc -l <"$tmp/out")" -eq 5 ] && [ "$(grep -c '^\[worker-[01]@a\] ' "$tmp/out")" -eq 2 ] &&
     grep '^\[worker-2@b\] ' "$tmp/out" | grep -q -- '--servers=a:50051,b:50052 --num_workers=3 --rank=2 --max_steps=1' &&
     grep -q '^\[shard-1@b\] ' "$tmp/out" && ! grep -q '@c\]' "$tmp/out" && echo yes)" \
  "$(head -c 600 "$tmp/out" "$tmp/err")"

# A command after --: run once per slot with the job in its environment.
mkdir -p "$tmp/job"
(cd "$tmp/job" && run "$launch" -np 2 --bin_dir=/opt/h --dry_run -- python3 train.py --epochs 3)
rc=$?
report "the command form: one shard, each rank's command with HARRIER_* in front" \
  "$([ $rc -eq 0 ] && [ "$(wc -l <"$tmp/out")" -eq 3 ] &&
     grep -qx '\[shard-0@localhost\] /opt/h/harrier-server --shard=0 --num_shards=1 --num_workers=2 --port=50051 --host=0.0.0.0' "$tmp/out" &&
     grep -qx '\[worker-0@localhost\] HARRIER_SERVERS=127.0.0.1:50051 HARRIER_NUM_SHARDS=1 HARRIER_NUM_WORKERS=2 HARRIER_RANK=0 HARRIER_LOCAL_RANK=0 HARRIER_LOCAL_SIZE=2 OMP_NUM_THREADS=1 python3 train.py --epochs 3' "$tmp/out" &&
     grep -qx '\[worker-1@localhost\] HARRIER_SERVERS=127.0.0.1:50051 HARRIER_NUM_SHARDS=1 HARRIER_NUM_WORKERS=2 HARRIER_RANK=1 HARRIER_LOCAL_RANK=1 HARRIER_LOCAL_SIZE=2 OMP_NUM_THREADS=1 python3 train.py --epochs 3' "$tmp/out" &&
     ! grep -q harrier-worker "$tmp/out" && echo yes)" "exit $rc: $(head -c 600 "$tmp/out" "$tmp/err")"
report "two workers on one host get OMP_NUM_THREADS=1, as torchrun gives them, and the launcher says so" \
  "$(grep -q 'OMP_NUM_THREADS=1 for each worker on localhost' "$tmp/err" && echo yes)" "$(head -c 600 "$tmp/err")"
(cd "$tmp/job" && env -i PATH="$PATH" OMP_NUM_THREADS=3 "$launch" -np 2 --bin_dir=/opt/h --dry_run \
  -- python3 train.py >"$tmp/out" 2>"$tmp/err")
report "an OMP_NUM_THREADS the user exported is passed on as it is" \
  "$([ "$(grep -c 'HARRIER_LOCAL_SIZE=2 OMP_NUM_THREADS=3 python3 train.py$' "$tmp/out")" -eq 2 ] &&
     ! grep -q OMP_NUM_THREADS "$tmp/err" && echo yes)" "$(head -c 600 "$tmp/out" "$tmp/err")"
run "$launch" -np 1 --bin_dir=/opt/h --dry_run -- sh -c 'echo "$HARRIER_RANK" done'
report "the command's words are shell-quoted" \
  "$(grep -qxF "[worker-0@localhost] HARRIER_SERVERS=127.0.0.1:50051 HARRIER_NUM_SHARDS=1 HARRIER_NUM_WORKERS=1 HARRIER_RANK=0 HARRIER_LOCAL_RANK=0 HARRIER_LOCAL_SIZE=1 sh -c 'echo \"\$HARRIER_RANK\" done'" "$tmp/out" &&
     echo yes)" "$(head -c 600 "$tmp/out" "$tmp/err")"
(cd "$tmp/job" && run "$launch" -np 3 -H a:2,b:2 --num_servers=1 --bin_dir=/opt/h --dry_run -- python3 train.py)
report "the command form over ssh: env VAR=value ... in the launcher's folder on the remote host" \
  "$([ "$(wc -l <"$tmp/out")" -eq 4 ] &&
     grep '^\[worker-2@b\] ssh .* b -- ' "$tmp/out" |
       grep -qF " harrier-launch-wrapper 10 $tmp/job env HARRIER_SERVERS=a:50051 HARRIER_NUM_SHARDS=1 HARRIER_NUM_WORKERS=3 HARRIER_RANK=2 HARRIER_LOCAL_RANK=0 HARRIER_LOCAL_SIZE=1 python3 train.py'" &&
     grep '^\[shard-0@a\] ssh .* a -- ' "$tmp/out" | grep -qF " harrier-launch-wrapper 10 '\'''\'' /opt/h/harrier-server --shard=0 " &&
     echo yes)" "$(head -c 600 "$tmp/out" "$tmp/err")"
run "$launch" -np 1 --bin_dir=/opt/h --dry_run -- --max_steps=1 train.py
report "a first word with - after -- means harrier-worker flags" \
  "$(grep -q '^\[worker-0@localhost\] /opt/h/harrier-worker .* --max_steps=1 train.py$' "$tmp/out" && echo yes)" \
  "$(head -c 300 "$tmp/out" "$tmp/err")"

# TLS and the job token: flags to the shards and harrier-worker, variables
# to a command; relative paths from the launcher's folder.
for f in ca.pem tls.crt tls.key token; do echo x >"$tmp/job/$f"; done
tls=(--tls_ca="$tmp/job/ca.pem" --tls_cert="$tmp/job/tls.crt" --tls_key="$tmp/job/tls.key" --auth_token_file="$tmp/job/token")
tls_flags="--tls_ca=$tmp/job/ca.pem --tls_cert=$tmp/job/tls.crt --tls_key=$tmp/job/tls.key --auth_token_file=$tmp/job/token"
run "$launch" -H localhost:1 "${tls[@]}" --bin_dir=/opt/h --dry_run -- --max_steps=1
report "TLS and token flags reach the shard and harrier-worker" \
  "$(grep -qxF "[shard-0@localhost] /opt/h/harrier-server --shard=0 --num_shards=1 --num_workers=1 --port=50051 --host=0.0.0.0 $tls_flags" "$tmp/out" &&
     grep -qxF "[worker-0@localhost] /opt/h/harrier-worker --servers=127.0.0.1:50051 --num_workers=1 --rank=0 $tls_flags --max_steps=1" "$tmp/out" &&
     echo yes)" "$(head -c 600 "$tmp/out" "$tmp/err")"
(cd "$tmp/job" && run "$launch" -np 1 --tls_ca=ca.pem --tls_cert=tls.crt --tls_key=./tls.key --auth_token_file=token \
  --bin_dir=/opt/h --dry_run -- python3 train.py)
report "TLS and token reach a command as HARRIER_TLS_* and HARRIER_AUTH_TOKEN_FILE (relative paths made absolute)" \
  "$(grep -qxF "[worker-0@localhost] HARRIER_SERVERS=127.0.0.1:50051 HARRIER_NUM_SHARDS=1 HARRIER_NUM_WORKERS=1 HARRIER_RANK=0 HARRIER_LOCAL_RANK=0 HARRIER_LOCAL_SIZE=1 HARRIER_TLS_CA=$tmp/job/ca.pem HARRIER_TLS_CERT=$tmp/job/tls.crt HARRIER_TLS_KEY=$tmp/job/./tls.key HARRIER_AUTH_TOKEN_FILE=$tmp/job/token python3 train.py" "$tmp/out" &&
     grep -qF -- "--host=0.0.0.0 --tls_ca=$tmp/job/ca.pem --tls_cert=$tmp/job/tls.crt --tls_key=$tmp/job/./tls.key --auth_token_file=$tmp/job/token" "$tmp/out" &&
     echo yes)" "$(head -c 600 "$tmp/out" "$tmp/err")"
run HARRIER_TLS_CA="$tmp/job/ca.pem" HARRIER_AUTH_TOKEN_FILE="$tmp/job/token" "$launch" -np 1 --bin_dir=/opt/h --dry_run -- --max_steps=1
report "HARRIER_TLS_CA and HARRIER_AUTH_TOKEN_FILE set the launcher's flags" \
  "$(grep -qF -- "--host=0.0.0.0 --tls_ca=$tmp/job/ca.pem --auth_token_file=$tmp/job/token" "$tmp/out" &&
     grep -qF -- "--rank=0 --tls_ca=$tmp/job/ca.pem --auth_token_file=$tmp/job/token --max_steps=1" "$tmp/out" &&
     [ ! -s "$tmp/err" ] && echo yes)" "$(head -c 600 "$tmp/out" "$tmp/err")"
run "$launch" -H node1:1 --tls_key=/nonexistent/tls.key --bin_dir=/opt/h --dry_run -- --max_steps=1
report "remote hosts: TLS files are theirs, not checked here" \
  "$(grep -q -- '--tls_key=/nonexistent/tls.key' "$tmp/out" && echo yes)" "$(head -c 300 "$tmp/out" "$tmp/err")"

# --base_port=0: a free port per shard, chosen by the launcher, the same in
# the shard's flags and the workers' server list.
run "$launch" -np 1 --num_servers=2 --base_port=0 --bin_dir=/opt/h --dry_run -- --max_steps=1
p0=$(sed -n 's/^\[shard-0@localhost\] .* --port=\([0-9]*\) .*/\1/p' "$tmp/out")
p1=$(sed -n 's/^\[shard-1@localhost\] .* --port=\([0-9]*\) .*/\1/p' "$tmp/out")
report "--base_port=0: free ports ($p0, $p1), in the worker's --servers" \
  "$([ -n "$p0" ] && [ -n "$p1" ] && [ "$p0" -gt 0 ] && [ "$p1" -gt 0 ] && [ "$p0" != "$p1" ] &&
     grep -q -- "--servers=127.0.0.1:$p0,127.0.0.1:$p1 --num_workers=1 --rank=0 --max_steps=1\$" "$tmp/out" && echo yes)" \
  "$(head -c 600 "$tmp/out" "$tmp/err")"

# --base_port from a flagfile, the environment and the command line.
printf -- '# the job\n--hosts=localhost:1\n--base_port=6000\n--server_args=--lr=0.1\n' >"$tmp/job.flags"
port_of_shard() { sed -n 's/.*harrier-server .*--port=\([0-9]*\) .*/\1/p' "$tmp/out"; }
run "$launch" --flagfile="$tmp/job.flags" --bin_dir=/opt/h --dry_run
report "a flagfile sets flags" \
  "$([ "$(port_of_shard)" = 6000 ] && grep -q -- '--host=0.0.0.0 --lr=0.1$' "$tmp/out" && echo yes)" \
  "$(head -c 300 "$tmp/out" "$tmp/err")"
run HARRIER_BASE_PORT=7000 "$launch" --config="$tmp/job.flags" --bin_dir=/opt/h --dry_run
report "HARRIER_BASE_PORT beats the file (--config is --flagfile)" "$([ "$(port_of_shard)" = 7000 ] && echo yes)" \
  "$(head -c 300 "$tmp/out" "$tmp/err")"
run HARRIER_BASE_PORT=7000 HARRIER_CONFIG="$tmp/job.flags" "$launch" --base_port=8000 --bin_dir=/opt/h --dry_run
report "the command line beats HARRIER_BASE_PORT and HARRIER_CONFIG's file" \
  "$([ "$(port_of_shard)" = 8000 ] && echo yes)" "$(head -c 300 "$tmp/out" "$tmp/err")"
run HARRIER_HOSTS=localhost:1 HARRIER_NUM_WORKERS=4 "$launch" --bin_dir=/opt/h --dry_run
report "HARRIER_HOSTS gives the hosts; a worker's variable is ignored in one line" \
  "$(grep -q -- '--num_workers=1 --rank=0$' "$tmp/out" && [ "$(wc -l <"$tmp/err")" -eq 1 ] &&
     grep -qx 'harrier-launch: ignoring HARRIER_NUM_WORKERS (no flag of harrier-launch by that name)' "$tmp/err" &&
     echo yes)" "$(head -c 300 "$tmp/out" "$tmp/err")"

for help in --help -h; do
  run "$launch" "$help"
  rc=$?
  report "$help exits 0 with the usage and every flag" \
    "$([ $rc -eq 0 ] && grep -q 'tearing down' "$tmp/out" && grep -q '^    --hosts (' "$tmp/out" &&
       grep -q '^    --start_timeout_ms (' "$tmp/out" && grep -q '^    --np (' "$tmp/out" &&
       grep -q '^    --tls_ca (' "$tmp/out" && grep -q '^    --auth_token_file (' "$tmp/out" &&
       grep -qF 'harrier-launch -np 4 -H a:2,b:2 -- python3 train.py' "$tmp/out" &&
       grep -q 'HARRIER_LOCAL_RANK' "$tmp/out" && echo yes)" "exit $rc"
done

expect_error() {  # name, wanted exit status (or "nonzero"), stderr text, [NAME=value...] command...
  local name=$1 want=$2 needle=$3; shift 3
  run "$@"
  local rc=$?
  if { [ "$want" = nonzero ] && [ $rc -ne 0 ] || [ "$rc" = "$want" ]; } &&
     [ "$(wc -l <"$tmp/err")" -eq 1 ] && grep -qF -- "$needle" "$tmp/err"; then
    report "$name" yes
  else
    report "$name" no "exit $rc: $(head -c 300 "$tmp/err")"
  fi
}
expect_error "an unknown flag" nonzero "'nope'" "$launch" -H localhost:1 --nope=1
expect_error "a value of the wrong type" nonzero "Illegal value 'soon' specified for flag 'grace_ms'" \
  "$launch" -H localhost:1 --grace_ms=soon
expect_error "a port out of range" 2 "harrier-launch: --base_port=70000: want a port in [1, 65535] (0: free ports, every host local)" \
  "$launch" -H localhost:1 --base_port=70000
expect_error "--base_port=0 with a remote host" 2 "harrier-launch: --base_port=0 (free ports) needs every host local" \
  "$launch" -H localhost:1,node1:1 --base_port=0 --bin_dir=/opt/h --dry_run
expect_error "a bad -H" 2 "harrier-launch: -H a:0: slots of a must be a positive integer, got '0'" "$launch" -H a:0
expect_error "a worker flag before --" 2 \
  "harrier-launch: unexpected argument 'max_steps=1' (worker flags go after --; see --help)" \
  "$launch" -H localhost:1 max_steps=1
printf 'hostA slots=1\nhostB:1\n' >"$tmp/job/hosts"
expect_error "no hosts" 2 "harrier-launch: no hosts: give -H host1:slots,... or --hostfile=FILE, or -np N" "$launch" -- --max_steps=1
expect_error "-np beyond the slots" 2 "harrier-launch: -np 5: more workers than the 4 slots of -H a:2,b:2" \
  "$launch" -np 5 -H a:2,b:2 -- python3 train.py
expect_error "-np beyond a hostfile's slots" 2 "harrier-launch: -np 3: more workers than the 2 slots of --hostfile=$tmp/job/hosts" \
  "$launch" -np 3 --hostfile="$tmp/job/hosts"
expect_error "a negative -np" 2 "harrier-launch: --np=-1: want a number of workers >= 1 (0: every slot)" "$launch" -np=-1
expect_error "-np that is no number" nonzero "Illegal value 'x' specified for flag 'np'" "$launch" -npx
expect_error "a TLS file that does not exist" 2 \
  "harrier-launch: cannot read --tls_key=$tmp/job/nope.key: No such file or directory" \
  "$launch" -np 1 --tls_key="$tmp/job/nope.key" --bin_dir=/opt/h --dry_run -- python3 train.py
expect_error "a token file that is a folder" 2 "harrier-launch: cannot read --auth_token_file=$tmp/job: not a file" \
  "$launch" -H localhost:1 --auth_token_file="$tmp/job" --bin_dir=/opt/h --dry_run
expect_error "a bad HARRIER_ value" 2 "HARRIER_GRACE_MS: bad value 'soon' for --grace_ms" \
  HARRIER_GRACE_MS=soon "$launch" -H localhost:1
# horovodrun's --timeline-filename: every worker records a timeline, a
# command from HARRIER_TIMELINE (quoted for sh: the path has braces),
# harrier-worker as --timeline; a relative path is the launcher's folder's.
(cd "$tmp/job" && run "$launch" -np 2 --bin_dir=/opt/h --dry_run --timeline-filename 't_{rank}.json' \
  -- python3 train.py)
report "--timeline-filename: HARRIER_TIMELINE for a command, absolute" \
  "$([ "$(grep -c "HARRIER_TIMELINE='$tmp/job/t_{rank}.json' OMP_NUM_THREADS=1 python3 train.py\$" "$tmp/out")" -eq 2 ] &&
     echo yes)" "$(head -c 600 "$tmp/out" "$tmp/err")"
run "$launch" -np 1 --bin_dir=/opt/h --dry_run --timeline_filename=/t/t.json -- --max_steps=1
report "--timeline_filename: --timeline for harrier-worker" \
  "$(grep -q -- '--rank=0 --timeline=/t/t.json --max_steps=1$' "$tmp/out" && echo yes)" \
  "$(head -c 600 "$tmp/out" "$tmp/err")"
echo "$((total - failures)) checks passed, $failures failed"
[ "$failures" -eq 0 ]
