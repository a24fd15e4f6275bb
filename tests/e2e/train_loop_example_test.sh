#!/usr/bin/env bash
# The README's client example trains against a real server and converges.
set -uo pipefail
root="$TEST_SRCDIR/${TEST_WORKSPACE:-harrier}"
"$root/server/harrier-server" --host=127.0.0.1 --port=0 --port_file="$TEST_TMPDIR/port" \
  --num_workers=1 --lr=0.2 2>"$TEST_TMPDIR/server.log" &
pid=$!
trap 'kill $pid 2>/dev/null; wait 2>/dev/null' EXIT
for _ in $(seq 300); do [ -s "$TEST_TMPDIR/port" ] && break; sleep 0.1; done
if "$root/examples/train_loop" --servers="127.0.0.1:$(cat "$TEST_TMPDIR/port")" --steps=300; then
  echo "1 checks passed, 0 failed"
else
  echo "0 checks passed, 1 failed"; exit 1
fi
