#!/usr/bin/env bash
# harrier-launch's flags through the real binary, with --dry_run on local
# hosts (no ssh needed): -H's spellings, a flagfile, HARRIER_<NAME>
# variables and their precedence, --help, one-line errors.
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
       grep -q '^    --start_timeout_ms (' "$tmp/out" && echo yes)" "exit $rc"
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
expect_error "a port out of range" 2 "harrier-launch: --base_port=70000: want a port in [1, 65535]" \
  "$launch" -H localhost:1 --base_port=70000
expect_error "a bad -H" 2 "harrier-launch: -H a:0: slots of a must be a positive integer, got '0'" "$launch" -H a:0
expect_error "a worker flag before --" 2 \
  "harrier-launch: unexpected argument 'max_steps=1' (worker flags go after --; see --help)" \
  "$launch" -H localhost:1 max_steps=1
expect_error "no hosts" 2 "harrier-launch: no hosts: give -H host1:slots,... or --hostfile=FILE" "$launch" -- --max_steps=1
expect_error "a bad HARRIER_ value" 2 "HARRIER_GRACE_MS: bad value 'soon' for --grace_ms" \
  HARRIER_GRACE_MS=soon "$launch" -H localhost:1
echo "$((total - failures)) checks passed, $failures failed"
[ "$failures" -eq 0 ]
