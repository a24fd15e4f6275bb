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
  [ -s "$1" ] && ! grep -Ev '^\{"[a-z0-9_]+":("[^"]*"|-?[0-9][0-9.eE+-]*|true|false)(,"[a-z0-9_]+":("[^"]*"|-?[0-9][0-9.eE+-]*|true|false))*\}$' "$1" >/dev/null
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

# --- embedding --quick -----------------------------------------------------------
expect_usage_error "embedding unknown case is refused" "bogus" embedding --cases=bogus
expect_usage_error "embedding unknown optimizer is refused" "bogus" embedding --optimizer=bogus
timeout 50 "$bench" embedding --quick >"$tmp/embedding.jsonl" 2>"$tmp/embedding.err"
rc=$?
if [ "$rc" -eq 0 ] && json_lines_ok "$tmp/embedding.jsonl"; then
  pass "embedding --quick prints JSON lines"
else
  fail "embedding --quick prints JSON lines (exit $rc): $(tail -n 5 "$tmp/embedding.err")"
fi
# One file per case, each line of it carrying the case's fields.
embedding_case_ok() {  # case field...
  local kase=$1; shift
  grep "\"case\":\"$kase\"" "$tmp/embedding.jsonl" >"$tmp/embedding_$kase.jsonl"
  [ -s "$tmp/embedding_$kase.jsonl" ] && fields_ok "$tmp/embedding_$kase.jsonl" bench case dim "$@"
}
if embedding_case_ok rate tables batch distinct_ids zipf shards wire_pull_ids_per_s \
     wire_push_ids_per_s inproc_lookup_ids_per_s inproc_apply_ids_per_s memcpy_ids_per_s \
     pull_wire_over_inproc push_wire_over_inproc lookup_over_memcpy target_wire_over_inproc &&
   positive_ok "$tmp/embedding_rate.jsonl" wire_pull_ids_per_s &&
   positive_ok "$tmp/embedding_rate.jsonl" wire_push_ids_per_s &&
   positive_ok "$tmp/embedding_rate.jsonl" inproc_lookup_ids_per_s &&
   positive_ok "$tmp/embedding_rate.jsonl" memcpy_ids_per_s; then
  pass "embedding rate lines carry their fields"
else
  fail "embedding rate lines carry their fields: $(head -n 2 "$tmp/embedding.jsonl")"
fi
if embedding_case_ok memory optimizer rows bytes_per_row raw_row_bytes memory_ratio \
     target_memory_ratio && positive_ok "$tmp/embedding_memory.jsonl" bytes_per_row &&
   [ "$(grep -c . "$tmp/embedding_memory.jsonl")" -eq 3 ]; then
  pass "embedding memory lines carry their fields, one per optimizer"
else
  fail "embedding memory lines carry their fields, one per optimizer"
fi
if embedding_case_ok cache cache_rows cache_staleness train_hit_rate serve_hit_rate \
     serve_pull_ids_per_s uncached_pull_ids_per_s; then
  pass "embedding cache lines carry their fields"
else
  fail "embedding cache lines carry their fields"
fi
if embedding_case_ok budget max_rows wire_rows_min wire_rows_max inproc_evicted \
     wire_pull_ids_per_s wire_push_ids_per_s; then
  pass "embedding budget lines carry their fields"
else
  fail "embedding budget lines carry their fields"
fi
if ! pgrep -f "$tmp/harrier-bench-" >/dev/null 2>&1 && ! ls -d "$tmp"/harrier-bench-* >/dev/null 2>&1; then
  pass "embedding leaves no server running"
else
  fail "embedding leaves no server running"
fi

# --- crc -----------------------------------------------------------------------
expect_usage_error "crc bad size is refused" "sizes" crc --sizes=4X
timeout 50 "$bench" crc --sizes=16K,1M --min_time=0.01 >"$tmp/crc.jsonl" 2>"$tmp/crc.err"
rc=$?
if [ "$rc" -eq 0 ] && json_lines_ok "$tmp/crc.jsonl" &&
   [ "$(grep -c . "$tmp/crc.jsonl")" -eq 2 ] &&
   fields_ok "$tmp/crc.jsonl" bench size_bytes crc_gbps crc_cold_gbps copy_crc_gbps \
     copy_crc_cold_gbps memcpy_gbps memcpy_cold_gbps crc_over_memcpy \
     copy_crc_cold_over_memcpy_cold reference_gbps crc_over_reference &&
   positive_ok "$tmp/crc.jsonl" crc_gbps && positive_ok "$tmp/crc.jsonl" copy_crc_cold_gbps &&
   grep -q '"size_bytes":16384' "$tmp/crc.jsonl" && grep -q '"size_bytes":1048576' "$tmp/crc.jsonl"; then
  pass "crc prints a JSON line per size with its fields"
else
  fail "crc prints a JSON line per size (exit $rc): $(tail -n 5 "$tmp/crc.err")"
fi

# --- checkpoint, tiny -----------------------------------------------------------
expect_usage_error "checkpoint bad fraction is refused" "not a fraction" checkpoint \
  --checkpoint_changed=2
timeout 50 "$bench" checkpoint --checkpoint_rows=2000 --checkpoint_dim=8 \
  --checkpoint_changed=0.01,1 >"$tmp/checkpoint.jsonl" 2>"$tmp/checkpoint.err"
rc=$?
if [ "$rc" -eq 0 ] && json_lines_ok "$tmp/checkpoint.jsonl" &&
   [ "$(grep -c . "$tmp/checkpoint.jsonl")" -eq 2 ] &&
   fields_ok "$tmp/checkpoint.jsonl" bench rows dim changed_fraction rows_changed_distinct \
     complete_bytes incremental_bytes incremental_over_complete complete_write_s \
     incremental_write_s &&
   positive_ok "$tmp/checkpoint.jsonl" complete_bytes; then
  pass "checkpoint prints a JSON line per fraction with its fields"
else
  fail "checkpoint prints a JSON line per fraction (exit $rc): $(tail -n 5 "$tmp/checkpoint.err")"
fi

echo "$passed checks passed, $failed failed"
[ "$failed" -eq 0 ]
