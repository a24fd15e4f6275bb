#!/usr/bin/env bash
# CI form of `harrier-bench load`: 16 clients x 5 s under ASP and under BSP
# against 2 real shards must end with no failed call and every parameter
# exactly as computed; a server that applies the wrong step must be caught;
# usage errors exit 2. Ends with "N checks passed, M failed".
set -uo pipefail
root="$TEST_SRCDIR/${TEST_WORKSPACE:-harrier}"
bench="$root/bench/harrier-bench"
server="$root/server/harrier-server"
tmp="${TEST_TMPDIR:-/tmp}"
passed=0
failed=0

pass() { echo "PASS $1"; passed=$((passed + 1)); }
fail() { echo "FAIL $1"; failed=$((failed + 1)); }

# The numeric or literal value of "field" in a flat JSON line.
field() {  # line field
  sed -n "s/.*\"$2\":\(\"[^\"]*\"\|[^,}]*\).*/\1/p" <<<"$1"
}

# --- the CI run ----------------------------------------------------------------
start=$(date +%s)
timeout 50 "$bench" load --quick >"$tmp/load.jsonl" 2>"$tmp/load.err"
rc=$?
echo "load --quick: exit $rc in $(( $(date +%s) - start )) s"
cat "$tmp/load.jsonl"
tail -n 4 "$tmp/load.err"
if [ "$rc" -eq 0 ]; then pass "load --quick exits 0"; else fail "load --quick exits 0 (exit $rc)"; fi
if [ "$(grep -c . "$tmp/load.jsonl")" -eq 2 ]; then
  pass "one JSON line per sync mode"
else
  fail "one JSON line per sync mode: $(head -c 400 "$tmp/load.jsonl")"
fi
# Flat JSON: string, number and boolean values only.
if [ -s "$tmp/load.jsonl" ] && ! grep -Ev '^\{"[a-z0-9_]+":("[^"]*"|-?[0-9][0-9.eE+-]*|true|false)(,"[a-z0-9_]+":("[^"]*"|-?[0-9][0-9.eE+-]*|true|false))*\}$' \
     "$tmp/load.jsonl" >/dev/null; then
  pass "stdout is flat JSON lines"
else
  fail "stdout is flat JSON lines"
fi
for sync in asp bsp; do
  line=$(grep "\"sync\":\"$sync\"" "$tmp/load.jsonl" | head -n 1)
  if [ -z "$line" ]; then
    fail "$sync: no line"
    continue
  fi
  missing=""
  for name in bench sync clients shards seconds ops errors p50_us p99_us ops_per_s exact_sum \
              steps min_steps max_steps bad_reads; do
    [ -n "$(field "$line" "$name")" ] || missing="$missing $name"
  done
  if [ -z "$missing" ]; then pass "$sync: every field"; else fail "$sync: missing$missing"; fi
  if [ "$(field "$line" errors)" = 0 ] && [ "$(field "$line" exact_sum)" = true ] &&
     [ "$(field "$line" bad_reads)" = 0 ]; then
    pass "$sync: 0 errors, 0 bad reads, exact sum"
  else
    fail "$sync: errors=$(field "$line" errors) bad_reads=$(field "$line" bad_reads) exact_sum=$(field "$line" exact_sum)"
  fi
  if [ "$(field "$line" clients)" = 16 ] && [ "$(field "$line" shards)" = 2 ] &&
     awk -v ops="$(field "$line" ops)" -v p50="$(field "$line" p50_us)" \
         -v p99="$(field "$line" p99_us)" -v steps="$(field "$line" min_steps)" \
         'BEGIN { exit !(ops > 0 && p50 > 0 && p99 >= p50 && steps > 0) }'; then
    pass "$sync: 16 clients, 2 shards, every client stepped, p99 >= p50 > 0"
  else
    fail "$sync: figures: $line"
  fi
done
if grep -q "^load: sync=bsp .*PASS" "$tmp/load.err" && grep -q "^load: sync=asp .*PASS" "$tmp/load.err"; then
  pass "one summary line per mode on stderr"
else
  fail "one summary line per mode on stderr"
fi

# --- the check catches a wrong result ---------------------------------------------
# A server whose steps are half as large (a later --lr wins): the bench must
# see the parameters differ and exit 1.
cat >"$tmp/half-lr-server" <<SCRIPT
#!/bin/sh
exec "$server" "\$@" --lr=0.5
SCRIPT
chmod +x "$tmp/half-lr-server"
timeout 30 "$bench" load --clients=4 --duration_s=1 --sync=bsp,asp \
  --server_binary="$tmp/half-lr-server" >"$tmp/wrong.jsonl" 2>"$tmp/wrong.err"
rc=$?
if [ "$rc" -eq 1 ] && [ "$(grep -c '"exact_sum":false' "$tmp/wrong.jsonl")" -eq 2 ] &&
   grep -q "elements differ" "$tmp/wrong.err"; then
  pass "a server applying lr 0.5 fails the exact check (exit 1)"
else
  fail "a server applying lr 0.5 fails the exact check (exit $rc): $(tail -n 3 "$tmp/wrong.err")"
fi

# --- usage errors ------------------------------------------------------------------
expect_usage_error() {  # name, expected stderr text, args...
  local name=$1 needle=$2; shift 2
  timeout 30 "$bench" load "$@" >"$tmp/usage.out" 2>"$tmp/usage.err"
  local rc=$?
  if [ "$rc" -eq 2 ] && grep -qi -- "$needle" "$tmp/usage.err"; then
    pass "$name"
  else
    fail "$name (exit $rc): $(head -c 300 "$tmp/usage.err")"
  fi
}
expect_usage_error "asp with a client count that is no power of two" "power of two" \
  --clients=3 --sync=asp
expect_usage_error "unknown sync mode" "ssp" --sync=ssp
expect_usage_error "unknown flag" "bogus" --bogus=1
expect_usage_error "bad --ops" "ops" --ops=sideways
if timeout 10 "$bench" load --help | grep -q -- "--clients"; then
  pass "--help lists the flags"
else
  fail "--help lists the flags"
fi

if ! pgrep -f "$tmp/harrier-bench-" >/dev/null 2>&1 && ! ls -d "$tmp"/harrier-bench-* >/dev/null 2>&1; then
  pass "no server left running"
else
  fail "no server left running"
fi

echo "$passed checks passed, $failed failed"
[ "$failed" -eq 0 ]
