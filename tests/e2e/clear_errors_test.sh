#!/usr/bin/env bash
# Mistakes at start-up fail at once with one line that names the mistake
# rather than later or in a log: a port in use, --servers out of shard order,
# a --checkpoint_dir that cannot take checkpoints, unknown flagfile keys, an
# unknown codec; HARRIER_* variables that name no flag are ignored, in one
# line. Real binaries on 127.0.0.1.
set -uo pipefail
root="$TEST_SRCDIR/${TEST_WORKSPACE:-harrier}"
server="$root/server/harrier-server"
worker="$root/worker/harrier-worker"
env_file="$root/deploy/k8s/base/harrier.env"
failures=0
total=0
report() {  # name, ok?, detail
  total=$((total + 1))
  if [ "$2" = yes ]; then echo "PASS $1"; else echo "FAIL $1: $3"; failures=$((failures + 1)); fi
}
expect_error() {  # name, exact stderr text (fixed string), command...
  local name=$1 needle=$2; shift 2
  local err="$TEST_TMPDIR/err.txt"
  timeout 20 "$@" >/dev/null 2>"$err"
  local rc=$?
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && grep -qF -- "$needle" "$err"; then
    report "$name" yes
  else
    report "$name" no "exit $rc, wanted '$needle', got: $(tail -n 3 "$err")"
  fi
}
expect_no_error() {  # name, text that must not appear, command...
  local name=$1 needle=$2; shift 2
  local err="$TEST_TMPDIR/err.txt"
  timeout 20 "$@" >/dev/null 2>"$err"
  if grep -qF -- "$needle" "$err"; then
    report "$name" no "$(grep -F -- "$needle" "$err" | head -n 3)"
  else
    report "$name" yes
  fi
}

pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null' EXIT
start_shard() {  # shard, port file
  "$server" --host=127.0.0.1 --port=0 --port_file="$2" --shard="$1" --num_shards=2 \
    --num_workers=1 2>"$2.log" &
  pids+=($!)
}
start_shard 0 "$TEST_TMPDIR/port0"
start_shard 1 "$TEST_TMPDIR/port1"
for _ in $(seq 100); do
  [ -s "$TEST_TMPDIR/port0" ] && [ -s "$TEST_TMPDIR/port1" ] && break
  sleep 0.1
done
port0=$(cat "$TEST_TMPDIR/port0")
port1=$(cat "$TEST_TMPDIR/port1")

# A second server on shard 0's port: without SO_REUSEPORT the bind fails.
expect_error "a port in use is named" "cannot listen on 127.0.0.1:$port0 (--port)" \
  "$server" --host=127.0.0.1 --port="$port0" --shard=0 --num_shards=2 --num_workers=1
if kill -0 "${pids[0]}" 2>/dev/null; then
  report "the first server keeps running" yes
else
  report "the first server keeps running" no "it exited: $(tail -n 3 "$TEST_TMPDIR/port0.log")"
fi

expect_error "shards in the wrong order" \
  "127.0.0.1:$port1 is not shard 0 (it says it is shard 1 of 2): list --servers in shard order" \
  "$worker" --servers="127.0.0.1:$port1,127.0.0.1:$port0" --max_steps=1 --train_examples=1000
expect_error "too few shards" "--servers lists 1 shards but 127.0.0.1:$port0 says there are 2" \
  "$worker" --servers="127.0.0.1:$port0" --max_steps=1 --train_examples=1000
# The first server still serves: a worker in the right order trains a step.
timeout 60 "$worker" --servers="127.0.0.1:$port0,127.0.0.1:$port1" --max_steps=1 \
  --train_examples=1000 --rpc_timeout_s=20 >/dev/null 2>"$TEST_TMPDIR/train.err"
rc=$?
report "shards in order train (the first server still serves)" "$([ $rc -eq 0 ] && echo yes)" \
  "exit $rc: $(tail -n 3 "$TEST_TMPDIR/train.err")"

# --checkpoint_dir: a regular file, a directory it cannot write, a missing
# one (created).
touch "$TEST_TMPDIR/a_file"
expect_error "checkpoint dir is a regular file" \
  "harrier-server: --checkpoint_dir=$TEST_TMPDIR/a_file is not a directory" \
  "$server" --host=127.0.0.1 --port=0 --checkpoint_dir="$TEST_TMPDIR/a_file"
if [ "$(id -u)" -ne 0 ]; then  # root writes anywhere
  mkdir -p "$TEST_TMPDIR/read_only" && chmod 0555 "$TEST_TMPDIR/read_only"
  expect_error "checkpoint dir not writable" \
    "harrier-server: --checkpoint_dir=$TEST_TMPDIR/read_only is not writable" \
    "$server" --host=127.0.0.1 --port=0 --checkpoint_dir="$TEST_TMPDIR/read_only"
fi
"$server" --host=127.0.0.1 --port=0 --port_file="$TEST_TMPDIR/port_ckpt" \
  --checkpoint_dir="$TEST_TMPDIR/new/checkpoints" 2>"$TEST_TMPDIR/ckpt.log" &
pids+=($!)
for _ in $(seq 300); do [ -s "$TEST_TMPDIR/port_ckpt" ] && break; sleep 0.1; done
report "a missing checkpoint dir is created at start" \
  "$([ -s "$TEST_TMPDIR/port_ckpt" ] && [ -d "$TEST_TMPDIR/new/checkpoints" ] && echo yes)" \
  "$(tail -n 3 "$TEST_TMPDIR/ckpt.log")"

# Flagfiles (--config is an alias of --flagfile) and the environment.
printf -- '--num_workers=1\n--bogus_setting=1\n' >"$TEST_TMPDIR/bad.conf"
for binary in "$server" "$worker"; do
  name=$(basename "$binary")
  expect_error "$name: unknown config-file key" "$TEST_TMPDIR/bad.conf:2: unknown flag 'bogus_setting'" \
    "$binary" --config="$TEST_TMPDIR/bad.conf"
  expect_error "$name: unknown config-file key via HARRIER_CONFIG" \
    "$TEST_TMPDIR/bad.conf:2: unknown flag 'bogus_setting'" \
    env HARRIER_CONFIG="$TEST_TMPDIR/bad.conf" "$binary"
  expect_error "$name: unknown key in a --flagfile" "$TEST_TMPDIR/bad.conf:2: unknown flag 'bogus_setting'" \
    "$binary" --flagfile="$TEST_TMPDIR/bad.conf"
  # A HARRIER_* variable that names no flag of the binary is another
  # binary's or a script's: ignored, and named in one line.
  timeout 20 env HARRIER_BOGUS_FLAG=1 "$binary" --help >/dev/null 2>"$TEST_TMPDIR/ignored.err"
  rc=$?
  report "$name: an unknown HARRIER_ variable is ignored, in one line" \
    "$([ "$rc" -eq 0 ] && [ "$(wc -l <"$TEST_TMPDIR/ignored.err")" -eq 1 ] &&
       grep -q "^$name: ignoring HARRIER_BOGUS_FLAG (no flag of $name by that name)$" "$TEST_TMPDIR/ignored.err" && echo yes)" \
    "exit $rc: $(head -c 300 "$TEST_TMPDIR/ignored.err")"
  # Every variable of the k8s job's shared environment (server and worker
  # pods get the same one), and every flag of the other binary, is accepted.
  # shellcheck disable=SC2046
  expect_error "$name: a bad value names the flag" "Illegal value 'many' specified for flag 'num_workers'" \
    "$binary" --num_workers=many
  expect_no_error "$name: deploy/k8s/base/harrier.env is accepted" "unknown HARRIER_" \
    env $(grep -E '^HARRIER_[A-Z0-9_]+=' "$env_file") "$binary" --help
  expect_no_error "$name: the scripts' HARRIER_ variables are accepted" "unknown HARRIER_" \
    env HARRIER_BIN_DIR=x HARRIER_BIN=x HARRIER_SERVER=x HARRIER_TEST_TRANSPORT=grpc \
    HARRIER_TEST_SLOWDOWN=1 HARRIER_FUZZ_TRACE=1 HARRIER_FUZZ_SECONDS=1 HARRIER_CLANG_OUT=x \
    HARRIER_CLANG_BAZEL_FLAGS=x HARRIER_PY_TEST_TIMEOUT=1 "$binary" --help
done
for binary in "$server" "$worker"; do
  timeout 10 "$binary" --help >"$TEST_TMPDIR/help.out" 2>&1
  rc=$?
  report "$(basename "$binary") --help exits 0 with its flags" \
    "$([ "$rc" -eq 0 ] && grep -q -- '--num_workers' "$TEST_TMPDIR/help.out" && echo yes)" "exit $rc"
done
flags_of() { "$1" --help 2>&1 | sed -n 's/^ *--\([a-z0-9_]*\) (.*/\1/p' | sort -u; }
flags_of "$server" >"$TEST_TMPDIR/server.flags"
flags_of "$worker" >"$TEST_TMPDIR/worker.flags"
report "--help lists the flags" \
  "$(grep -qx checkpoint_dir "$TEST_TMPDIR/server.flags" && grep -qx codec "$TEST_TMPDIR/worker.flags" && echo yes)" \
  "cannot read the flag names from --help"
others_as_env() {  # flags of the other binary that this one lacks, as NAME=1
  comm -23 "$1" "$2" | tr '[:lower:]' '[:upper:]' | sed 's/^/HARRIER_/; s/$/=1/'
}
# shellcheck disable=SC2046
expect_no_error "harrier-server accepts every worker flag's variable" "unknown HARRIER_" \
  env $(others_as_env "$TEST_TMPDIR/worker.flags" "$TEST_TMPDIR/server.flags") "$server" --help
# shellcheck disable=SC2046
expect_no_error "harrier-worker accepts every server flag's variable" "unknown HARRIER_" \
  env $(others_as_env "$TEST_TMPDIR/server.flags" "$TEST_TMPDIR/worker.flags") "$worker" --help

expect_error "unknown codec lists the known ones" \
  "codec spec \"bogus\": unknown codec \"bogus\" (known: none, fp16, bf16, topk, randomk, threshold, qsgd, terngrad, sign, efsign, signum, onebit, powersgd)" \
  "$worker" --servers="127.0.0.1:$port0,127.0.0.1:$port1" --codec=bogus

echo "$((total - failures)) checks passed, $failures failed"
[ "$failures" -eq 0 ]
