#!/usr/bin/env bash
# harrier-allreduce-replay as the overlap bench runs it, on 127.0.0.1: three
# ranks as real processes replay ResNet-50 (25.6 M parameters, ~100 MB of
# gradients per rank per step) and must each end with exact parameters, the
# same step counts, and the ring's 2(n-1)/n bytes both as reported and as the
# kernel's TCP counters saw them move; a run that skips a bucket's reduction
# must fail its check; a missing peer must end in a bounded time.
# Ends with "N checks passed, M failed".
set -uo pipefail
root="$TEST_SRCDIR/${TEST_WORKSPACE:-harrier}"
bin="$root/bench/allreduce/harrier-allreduce-replay"
tmp="$(mktemp -d "${TEST_TMPDIR:-/tmp}/allreduce.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
passed=0
failed=0

pass() { echo "PASS $1"; passed=$((passed + 1)); }
fail() { echo "FAIL $1"; failed=$((failed + 1)); }

# The numeric or literal value of "field" in a flat JSON line.
field() {  # line field
  sed -n "s/.*\"$2\":\(\"[^\"]*\"\|[^,}]*\).*/\1/p" <<<"$1"
}

# Runs `world` ranks with a fresh rendezvous directory; rank r's stdout in
# $tmp/NAME.r.out, stderr in .err, exit status in .rc.
run_ranks() {  # name world flags...
  local name=$1 world=$2
  shift 2
  local rdv="$tmp/$name.rdv"
  mkdir -p "$rdv"
  local pids=()
  for ((r = 0; r < world; r++)); do
    ( timeout 60 "$bin" --rank="$r" --world="$world" --rendezvous_dir="$rdv" \
        --address=127.0.0.1 --timeout_s=30 "$@" >"$tmp/$name.$r.out" 2>"$tmp/$name.$r.err"
      echo $? >"$tmp/$name.$r.rc" ) &
    pids+=($!)
  done
  wait "${pids[@]}"
}

summary() {  # name rank
  sed -n 's/^replay_summary //p' "$tmp/$1.$2.out"
}

# --- three ranks, ResNet-50, DDP's 25 MiB buckets ----------------------------
start=$(date +%s)
run_ranks r50 3 --model=resnet50 --compute_scale=0.01 --steps=3 --warmup_steps=1
echo "resnet50 x3: $(( $(date +%s) - start )) s"
model_bytes=102228128  # ResNet-50's 25,557,032 float32 parameters
iters=()
for r in 0 1 2; do
  rc=$(cat "$tmp/r50.$r.rc")
  line=$(summary r50 "$r")
  echo "rank $r: exit $rc: $line"
  [ "$rc" = 0 ] || { tail -n 3 "$tmp/r50.$r.err"; }
  if [ "$rc" = 0 ] && [ "$(grep -c '^replay_summary ' "$tmp/r50.$r.out")" = 1 ] &&
     [ "$(grep -c . "$tmp/r50.$r.out")" = 1 ]; then
    pass "rank $r exits 0 with exactly one replay_summary line on stdout"
  else
    fail "rank $r: exit $rc, stdout: $(head -c 300 "$tmp/r50.$r.out")"
  fi
  if [ -n "$line" ] && grep -Eq '^\{"[a-z0-9_]+":("[^"]*"|-?[0-9][0-9.eE+-]*|true|false)(,"[a-z0-9_]+":("[^"]*"|-?[0-9][0-9.eE+-]*|true|false))*\}$' <<<"$line"; then
    pass "rank $r: flat JSON"
  else
    fail "rank $r: not flat JSON"
  fi
  missing=""
  for name in model techniques compute_scale rank workers shards steps warmup_steps iter_ms \
              compute_ms bytes_pushed_per_iter bytes_pulled_per_iter bytes_per_iter checked; do
    [ -n "$(field "$line" "$name")" ] || missing="$missing $name"
  done
  if [ -z "$missing" ]; then pass "rank $r: every summary field"; else fail "rank $r: missing$missing"; fi
  if [ "$(field "$line" checked)" = true ]; then
    pass "rank $r: checked=true (sampled parameters bit-exact)"
  else
    fail "rank $r: checked=$(field "$line" checked)"
  fi
  if [ "$(field "$line" model)" = '"resnet50"' ] && [ "$(field "$line" techniques)" = '"allreduce"' ] &&
     [ "$(field "$line" rank)" = "$r" ] && [ "$(field "$line" workers)" = 3 ] &&
     [ "$(field "$line" shards)" = 0 ] && [ "$(field "$line" steps)" = 3 ] &&
     [ "$(field "$line" warmup_steps)" = 1 ] && [ "$(field "$line" model_bytes)" = "$model_bytes" ] &&
     [ "$(field "$line" buckets)" = 4 ]; then
    pass "rank $r: model, techniques, rank, 3 workers, 0 shards, 3 steps, 1 warm-up, 4 buckets"
  else
    fail "rank $r: identity fields: $line"
  fi
  # Each bucket rounds 2(n-1)/n of its bytes down: at most one byte per bucket.
  if awk -v p="$(field "$line" bytes_pushed_per_iter)" -v q="$(field "$line" bytes_pulled_per_iter)" \
         -v t="$(field "$line" bytes_per_iter)" -v m="$model_bytes" -v b="$(field "$line" buckets)" \
         'BEGIN { e = 2 * 2 * m / 3; exit !(p <= e && e - p <= b && p == q && t == p + q) }'; then
    pass "rank $r: bytes pushed = pulled = 2(n-1)/n x model bytes, bytes_per_iter their sum"
  else
    fail "rank $r: bytes: $line"
  fi
  # The kernel's counters: the ring really moved that much (gloo's headers
  # add a few hundred bytes per segment: within 0.5 % above). A rank has
  # received all it needs when its step ends, so received is complete; its
  # last sent segments (two of <= 1 MiB in flight) may not be acknowledged
  # yet when it samples, so sent may read up to 1 % low.
  if awk -v p="$(field "$line" bytes_pushed_per_iter)" \
         -v s="$(field "$line" measured_bytes_sent_per_iter)" \
         -v g="$(field "$line" measured_bytes_received_per_iter)" \
         'BEGIN { exit !(s >= p * 0.99 && s <= p * 1.005 && g >= p && g <= p * 1.005) }'; then
    pass "rank $r: TCP counters moved the reported bytes (within 0.5 %)"
  else
    fail "rank $r: measured bytes differ from the formula: $line"
  fi
  if awk -v i="$(field "$line" iter_ms)" -v c="$(field "$line" compute_ms)" \
         'BEGIN { exit !(c > 1 && c < 3 && i >= c) }'; then
    pass "rank $r: compute_ms = ResNet-50's modelled step x 0.01, iter_ms >= compute_ms"
  else
    fail "rank $r: times: $line"
  fi
  # CPU over the timed steps: some spent, no more than every core of this
  # machine for the whole span, the gradient writes counted apart; the span
  # on the steady clock is the timed steps' (2 of iter_ms each).
  if awk -v c="$(field "$line" cpu_seconds_per_iter)" -v w="$(field "$line" gradient_write_cpu_seconds_per_iter)" \
         -v i="$(field "$line" iter_ms)" -v s="$(field "$line" timed_start_monotonic_ns)" \
         -v e="$(field "$line" timed_end_monotonic_ns)" -v n="$(nproc)" \
         'BEGIN { span = (e - s) / 1e6; exit !(c > 0 && w > 0 && c + w <= n * i / 1e3 * 1.05 &&
                  span >= 2 * i * 0.95 && span <= 2 * i * 1.05 + 5) }'; then
    pass "rank $r: cpu_seconds_per_iter and the timed span on the steady clock"
  else
    fail "rank $r: cpu or span: $line"
  fi
  iters+=("$(field "$line" steps)")
done
if [ "${#iters[@]}" = 3 ] && [ "${iters[0]}" = "${iters[1]}" ] && [ "${iters[1]}" = "${iters[2]}" ]; then
  pass "every rank ran the same number of steps"
else
  fail "step counts differ: ${iters[*]}"
fi

# --- one all-reduce after backward (bucket_bytes 0), two ranks ------------------
run_ranks one 2 --model=resnet50 --compute_scale=0.01 --steps=2 --bucket_bytes=0
ok=1
for r in 0 1; do
  line=$(summary one "$r")
  [ "$(cat "$tmp/one.$r.rc")" = 0 ] && [ "$(field "$line" checked)" = true ] &&
    [ "$(field "$line" buckets)" = 1 ] && [ "$(field "$line" bytes_pushed_per_iter)" = "$model_bytes" ] || ok=0
done
if [ "$ok" = 1 ]; then
  pass "bucket_bytes=0: one bucket, exact, 2 ranks send M each (2(n-1)/n = 1)"
else
  fail "bucket_bytes=0: $(summary one 0) $(tail -n 2 "$tmp/one.0.err")"
fi

# --- buckets are reduced while backward goes on ---------------------------------
# At 3x ResNet-50's modelled speed (backward ~430 ms, slept) the buckets of
# the last layers are complete long before backward ends and the
# communication thread starts the first at once: at least 1 of the 4 must
# begin before backward ends (how many more depends on how fast the first
# ones finish on this shared CPU; the 3x leaves a busy scheduler hundreds
# of ms to start the thread); with bucket_bytes=0 none can.
run_ranks overlap 2 --model=resnet50 --compute_scale=3 --steps=2
line=$(summary overlap 0)
echo "overlap: $line"
if [ "$(cat "$tmp/overlap.0.rc")" = 0 ] && [ "$(field "$line" checked)" = true ] &&
   awk -v o="$(field "$line" overlapped_buckets)" 'BEGIN { exit !(o >= 1) }' &&
   awk -v o="$(field "$(summary one 0)" overlapped_buckets)" 'BEGIN { exit !(o == 0) }'; then
  pass "25 MiB buckets: $(field "$line" overlapped_buckets) of 4 started during backward (>= 1); one bucket: 0"
else
  fail "overlap: $line / $(summary one 0)"
fi

# --- a broken reduction is caught ------------------------------------------------
# Every rank skips the all-reduce of bucket 1 (its parameters step with the
# local gradient alone): each check must fail and the process exit non-zero.
run_ranks skip 3 --model=resnet50 --compute_scale=0.01 --steps=2 --test_skip_bucket=1
for r in 0 1 2; do
  line=$(summary skip "$r")
  rc=$(cat "$tmp/skip.$r.rc")
  if [ "$rc" != 0 ] && [ "$(field "$line" checked)" = false ] &&
     grep -q "check failed" "$tmp/skip.$r.err"; then
    pass "skipped bucket: rank $r checked=false, exit $rc, says so on stderr"
  else
    fail "skipped bucket not caught on rank $r: exit $rc: $line"
  fi
done

# --- a missing peer ends in bounded time ------------------------------------------
# World 2 with only rank 0 started: the rendezvous times out after
# --timeout_s and the process says so in one line.
mkdir -p "$tmp/alone.rdv"
start=$(date +%s)
timeout 30 "$bin" --model=resnet50 --rank=0 --world=2 --rendezvous_dir="$tmp/alone.rdv" \
  --timeout_s=2 >"$tmp/alone.out" 2>"$tmp/alone.err"
rc=$?
took=$(( $(date +%s) - start ))
if [ "$rc" != 0 ] && [ "$rc" != 124 ] && [ "$took" -le 15 ] && [ ! -s "$tmp/alone.out" ] &&
   grep -q "^harrier-allreduce-replay: DEADLINE_EXCEEDED: gloo rendezvous of rank 0 of 2" "$tmp/alone.err"; then
  pass "missing peer: exit $rc after $took s: $(grep '^harrier-allreduce-replay' "$tmp/alone.err" | head -c 200)"
else
  fail "missing peer: exit $rc after $took s: $(tail -n 2 "$tmp/alone.err")"
fi

# A reused rendezvous directory is refused in one line, not waited on.
timeout 30 "$bin" --model=resnet50 --rank=0 --world=1 --rendezvous_dir="$tmp/alone.rdv" \
  --steps=2 >/dev/null 2>"$tmp/reuse.err"
timeout 30 "$bin" --model=resnet50 --rank=0 --world=1 --rendezvous_dir="$tmp/alone.rdv" \
  --steps=2 >/dev/null 2>"$tmp/reuse.err"
rc=$?
if [ "$rc" != 0 ] && grep -q "^harrier-allreduce-replay: FAILED_PRECONDITION: .*fresh one" "$tmp/reuse.err"; then
  pass "a reused rendezvous directory: exit $rc, FAILED_PRECONDITION asking for a fresh one"
else
  fail "a reused rendezvous directory: exit $rc: $(tail -n 1 "$tmp/reuse.err" | head -c 300)"
fi

# --- usage -------------------------------------------------------------------------
# (The exit status of --help is common/flags' ParseFlags', absl's: 1.)
"$bin" --help >"$tmp/help" 2>&1
rc=$?
if grep -q "^Usage: harrier-allreduce-replay" "$tmp/help" && grep -q -- "--bucket_bytes" "$tmp/help" &&
   grep -q -- "--rendezvous_dir" "$tmp/help"; then
  pass "--help lists the flags"
else
  fail "--help: exit $rc"
fi
"$bin" --model=resnet50 --rank=3 --world=2 --rendezvous_dir="$tmp" >"$tmp/usage.out" 2>"$tmp/usage.err"
rc=$?
if [ "$rc" != 0 ] && [ "$(grep -c . "$tmp/usage.err")" = 1 ] && [ ! -s "$tmp/usage.out" ]; then
  pass "a rank outside the world: exit $rc, one line: $(cat "$tmp/usage.err")"
else
  fail "a rank outside the world: exit $rc: $(head -c 300 "$tmp/usage.err")"
fi
"$bin" --model=alexnet --rank=0 --world=1 --rendezvous_dir="$tmp" >/dev/null 2>"$tmp/model.err"
rc=$?
if [ "$rc" != 0 ] && grep -q "resnet50" "$tmp/model.err"; then
  pass "an unknown model: exit $rc, the known names listed"
else
  fail "an unknown model: exit $rc: $(head -c 300 "$tmp/model.err")"
fi

echo "$passed checks passed, $failed failed"
[ "$failed" = 0 ]
