#!/usr/bin/env bash
# Smoke test of harrier-bench: the subcommands run, their stdout is one flat
# JSON object per line carrying the documented fields, and usage errors exit
# non-zero with a message. Figures are not judged here (noisy machines).
set -uo pipefail
root="$TEST_SRCDIR/${TEST_WORKSPACE:-harrier}"
bench="$root/bench/harrier-bench"
tmp="${TEST_TMPDIR:-/tmp}"
passed=0
failed=0

pass() { echo "PASS $1"; passed=$((passed + 1)); }
fail() { echo "FAIL $1"; failed=$((failed + 1)); }

# Every line is a flat JSON object of string and number values.
json_lines_ok() {  # file
  [ -s "$1" ] && ! grep -Ev '^\{"[a-z0-9_]+":("[^"]*"|-?[0-9][0-9.eE+-]*)(,"[a-z0-9_]+":("[^"]*"|-?[0-9][0-9.eE+-]*))*\}$' "$1" >/dev/null
}

# Every line carries every named field.
fields_ok() {  # file field...
  local file=$1; shift
  local total field
  total=$(grep -c . "$file")
  for field in "$@"; do
    if [ "$(grep -c "\"$field\":" "$file")" -ne "$total" ]; then
      echo "  field '$field' missing from some of $total lines"
      return 1
    fi
  done
}

# Every line's numeric field is > 0.
positive_ok() {  # file field
  awk -v field="\"$2\":" '
    { i = index($0, field); if (i == 0) { bad = 1; next }
      rest = substr($0, i + length(field)); split(rest, parts, /[,}]/)
      if (parts[1] + 0 <= 0) bad = 1 }
    END { exit bad }' "$1"
}

expect_usage_error() {  # name, expected stderr text, args...
  local name=$1 needle=$2; shift 2
  timeout 30 "$bench" "$@" >"$tmp/usage.out" 2>"$tmp/usage.err"
  local rc=$?
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && grep -qi -- "$needle" "$tmp/usage.err"; then
    pass "$name"
  else
    fail "$name (exit $rc): $(head -c 300 "$tmp/usage.err")"
  fi
}

# --- usage -----------------------------------------------------------------
if "$bench" --help >"$tmp/help.out" 2>&1 && grep -q transport "$tmp/help.out" &&
   grep -q codec "$tmp/help.out"; then
  pass "--help lists the subcommands"
else
  fail "--help lists the subcommands: $(head -c 300 "$tmp/help.out")"
fi
expect_usage_error "unknown subcommand exits non-zero" "unknown subcommand" nosuchbench
expect_usage_error "no subcommand exits non-zero" "usage" 
expect_usage_error "transport --transport=bogus is refused" "bogus" transport --transport=bogus
expect_usage_error "transport unknown flag is refused" "bogus" transport --bogus=1
expect_usage_error "transport with a missing server binary is refused" "server_binary" \
  transport --quick --server_binary="$tmp/no-such-server"

# --- transport --quick -------------------------------------------------------
# No --server_binary: the bench finds harrier-server in its runfiles.
timeout 50 "$bench" transport --quick >"$tmp/transport.jsonl" 2>"$tmp/transport.err"
rc=$?
if [ "$rc" -eq 0 ]; then
  pass "transport --quick exits 0"
else
  fail "transport --quick exits 0 (exit $rc): $(tail -n 5 "$tmp/transport.err")"
fi
if json_lines_ok "$tmp/transport.jsonl"; then
  pass "transport stdout is JSON lines"
else
  fail "transport stdout is JSON lines: $(head -n 3 "$tmp/transport.jsonl")"
fi
if fields_ok "$tmp/transport.jsonl" bench op size_bytes shards workers goodput_gbps p50_us \
     p99_us tcp_gbps ratio; then
  pass "transport lines carry the required fields"
else
  fail "transport lines carry the required fields"
fi
for op in push pull pushpull tcp_pingpong; do
  if grep -q "\"op\":\"$op\"" "$tmp/transport.jsonl"; then
    pass "transport measured $op"
  else
    fail "transport measured $op"
  fi
done
if grep -q '"shards":2' "$tmp/transport.jsonl"; then
  pass "transport measured two shards"
else
  fail "transport measured two shards"
fi
if positive_ok "$tmp/transport.jsonl" goodput_gbps && positive_ok "$tmp/transport.jsonl" tcp_gbps \
   && positive_ok "$tmp/transport.jsonl" p50_us; then
  pass "transport figures are positive"
else
  fail "transport figures are positive"
fi
# The servers it started are gone: their command lines named port files in
# a harrier-bench-* directory of $tmp, which is removed too.
if ! pgrep -f "$tmp/harrier-bench-" >/dev/null 2>&1 && ! ls -d "$tmp"/harrier-bench-* >/dev/null 2>&1; then
  pass "no server left running"
else
  fail "no server left running"
fi

# --- transport over UCX (tcp) ------------------------------------------------------
UCX_TLS=tcp timeout 50 "$bench" transport --quick --transport=ucx --shards=1 --ops=pushpull \
  >"$tmp/transport_ucx.jsonl" 2>"$tmp/transport_ucx.err"
rc=$?
if [ "$rc" -eq 0 ] && json_lines_ok "$tmp/transport_ucx.jsonl" &&
   grep -q '"transport":"ucx"' "$tmp/transport_ucx.jsonl" &&
   positive_ok "$tmp/transport_ucx.jsonl" goodput_gbps &&
   positive_ok "$tmp/transport_ucx.jsonl" memcpy_gbps; then
  pass "transport --transport=ucx measures over UCX"
else
  fail "transport --transport=ucx measures over UCX (exit $rc): $(tail -n 5 "$tmp/transport_ucx.err")"
fi

# --- codec ---------------------------------------------------------------------
timeout 50 "$bench" codec --sizes=100000 --codecs=topk:ratio=0.01 \
  >"$tmp/codec.jsonl" 2>"$tmp/codec.err"
rc=$?
if [ "$rc" -eq 0 ]; then
  pass "codec exits 0"
else
  fail "codec exits 0 (exit $rc): $(tail -n 5 "$tmp/codec.err")"
fi
if json_lines_ok "$tmp/codec.jsonl" &&
   fields_ok "$tmp/codec.jsonl" bench codec elements encode_gbps decode_gbps memcpy_gbps \
     encode_ratio decode_ratio compression_ratio breakeven_gbps wire_bytes &&
   positive_ok "$tmp/codec.jsonl" breakeven_gbps &&
   grep -q '"bench":"codec"' "$tmp/codec.jsonl" && grep -q '"elements":100000' "$tmp/codec.jsonl"; then
  pass "codec prints JSON lines with its fields"
else
  fail "codec prints JSON lines with its fields: $(head -n 3 "$tmp/codec.jsonl")"
fi

echo "$passed checks passed, $failed failed"
[ "$failed" -eq 0 ]
