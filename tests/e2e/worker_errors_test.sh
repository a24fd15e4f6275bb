#!/usr/bin/env bash
# Bad input to harrier-worker: one clear line on stderr and a non-zero exit,
# never a hang.
set -uo pipefail
root="$TEST_SRCDIR/${TEST_WORKSPACE:-harrier}"
server="$root/server/harrier-server"
worker="$root/worker/harrier-worker"
failures=0
total=0
expect_error() {  # name, expected stderr text, command...
  local name=$1 needle=$2; shift 2
  total=$((total + 1))
  local err="$TEST_TMPDIR/err.txt"
  timeout 30 "$@" >/dev/null 2>"$err"
  local rc=$?
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && grep -q -- "$needle" "$err"; then
    echo "PASS $name"
  else
    echo "FAIL $name (exit $rc): $(tail -n 3 "$err")"; failures=$((failures + 1))
  fi
}

"$server" --host=127.0.0.1 --port=0 --port_file="$TEST_TMPDIR/port" --num_workers=2 \
  2>"$TEST_TMPDIR/server.log" &
server_pid=$!
trap 'kill $server_pid 2>/dev/null; wait 2>/dev/null' EXIT
for _ in $(seq 300); do [ -s "$TEST_TMPDIR/port" ] && break; sleep 0.1; done
address="127.0.0.1:$(cat "$TEST_TMPDIR/port")"

mkdir -p "$TEST_TMPDIR/corrupt"
printf 'not gzip at all' >"$TEST_TMPDIR/corrupt/train-images-idx3-ubyte.gz"
cp /usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz "$TEST_TMPDIR/corrupt/"

expect_error "missing data directory" "/nonexistent" \
  "$worker" --servers="$address" --data_dir=/nonexistent
expect_error "corrupt data file" "train-images" \
  "$worker" --servers="$address" --data_dir="$TEST_TMPDIR/corrupt"
expect_error "unreachable servers" "cannot connect" \
  "$worker" --servers=127.0.0.1:1 --connect_timeout_s=2
expect_error "malformed --servers" "host:port" "$worker" --servers=nonsense
expect_error "unknown flag" "bogus" "$worker" --bogus=1
expect_error "worker count disagrees with the servers" "num_workers" \
  "$worker" --servers="$address" --num_workers=3
# First worker registers 784-256-256-10 and trains; a second with another
# shape must be refused by the shard, naming the tensor.
"$worker" --servers="$address" --rank=0 --max_steps=1 --train_examples=1000 --rpc_timeout_s=5 \
  >/dev/null 2>"$TEST_TMPDIR/first.err" &
first=$!
# Rank 0 registers its tensors right after its client is up (its "[worker 0]"
# lines): wait for those, then a second for the registration itself, rather
# than a fixed second from the start that a busy machine can outlast.
for _ in $(seq 300); do grep -q '^\[worker 0\] compression' "$TEST_TMPDIR/first.err" && break; sleep 0.1; done
sleep 1
expect_error "model shape disagrees with the shard" "fc0.weight" \
  "$worker" --servers="$address" --rank=1 --layers=784,128,10 --train_examples=1000
kill $first 2>/dev/null
wait $first 2>/dev/null

# Flags from the environment and a flagfile (--config is an alias of
# --flagfile): bad values are refused naming their source; flags win over
# the environment, which wins over the file.
expect_error "bad HARRIER_ environment value" "HARRIER_EPOCHS" \
  env HARRIER_EPOCHS=many "$worker" --servers="$address"
printf -- '--num_workers=2\n--bogus_setting=1\n' >"$TEST_TMPDIR/bad.conf"
expect_error "unknown name in a config file" "bad.conf:2" \
  "$worker" --config="$TEST_TMPDIR/bad.conf" --servers="$address"
# Rank 1 from here on: rank 0's worker was killed (no clean exit), so its
# session stays live until --heartbeat_timeout_ms and a Register for rank 0
# would be refused ALREADY_EXISTS; rank 1's worker exited and gave its back.
printf -- '# settings\n--num_workers=5\n' >"$TEST_TMPDIR/five.conf"
expect_error "config file value reaches the flag" "--num_workers=5" \
  "$worker" --config="$TEST_TMPDIR/five.conf" --rank=1 --servers="$address"
expect_error "environment beats the config file" "--num_workers=7" \
  env HARRIER_NUM_WORKERS=7 "$worker" --config="$TEST_TMPDIR/five.conf" --rank=1 --servers="$address"
expect_error "a flag beats the environment" "--num_workers=9" \
  env HARRIER_NUM_WORKERS=7 "$worker" --num_workers=9 --rank=1 --servers="$address"

echo "$((total - failures)) checks passed, $failures failed"
[ "$failures" -eq 0 ]
