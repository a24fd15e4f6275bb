#!/usr/bin/env bash
# The clang-14 checks of deploy/test.sh, in one output base of their own
# (a compiler switch would otherwise throw away the gcc build's outputs):
#
#   1. one build, --config=asan (.bazelrc): clang-14 with
#      -Werror=thread-safety, ASan + UBSan and libFuzzer's coverage
#      instrumentation, of common/, server/, worker/ and bench/advise/
#      ("clang build"),
#      then the libFuzzer binaries from the same objects ("fuzz build");
#   2. the unit and integration tests on that build, one check per test
#      target (//tests/... less the targets tagged no_sanitizers);
#   3. each libFuzzer target for $HARRIER_FUZZ_SECONDS (30) s from a copy
#      of its committed corpus, one check each;
#   4. TSan, a build of its own, on the unit tests (//tests:unit_tests), one
#      check per test target.
#
# Prints a PASS/FAIL line per check, each phase's time, and ends with
# "N passed, M failed" (deploy/test.sh adds it to its own count).
# HARRIER_CLANG_OUT: the output base (default $HOME/.cache/harrier-clang-out);
# HARRIER_CLANG_BAZEL_FLAGS: extra flags for every build and test, e.g.
# "--disk_cache=" to measure a cold run in a fresh output base.
set -uo pipefail
cd "$(dirname "$0")/.."

passed=0
failed=0
logs=$(mktemp -d "${TMPDIR:-/tmp}/harrier-clang.XXXXXX")
clang_out="${HARRIER_CLANG_OUT:-$HOME/.cache/harrier-clang-out}"
read -r -a extra <<<"${HARRIER_CLANG_BAZEL_FLAGS:-}"
fuzz_seconds="${HARRIER_FUZZ_SECONDS:-30}"
cbazel() { bazel --output_base="$clang_out" "$@"; }
# Each phase's wall time, and the CPU seconds its Bazel server's actions and
# tests used (reaped children of the server, from /proc): on shared cores
# the second says what the phase costs without the contention.
server_cpu() {
  local pid
  pid=$(cat "$clang_out/server/server.pid.txt" 2>/dev/null) &&
    awk '{printf "%d", ($14 + $15 + $16 + $17) / 100}' "/proc/$pid/stat" 2>/dev/null || echo 0
}
phase_start=$SECONDS
phase_cpu=$(server_cpu)  # a server still up from an earlier run has spent some
phase_time() {
  local cpu; cpu=$(server_cpu)
  [ "$cpu" -lt "$phase_cpu" ] && phase_cpu=0  # a new server
  echo "time $1: $((SECONDS - phase_start)) s wall, $((cpu - phase_cpu)) s Bazel CPU"
  phase_start=$SECONDS; phase_cpu=$cpu
}

if ! command -v clang-14 >/dev/null 2>&1; then
  echo "FAIL clang build (clang-14 not installed)"
  echo "0 passed, 1 failed"
  exit 1
fi

# Sanitizer tests, one check per target: PASSED counts as passed, any
# other verdict (FAILED, TIMEOUT, FAILED TO BUILD, NO STATUS) as failed.
# CI keeps only this script's output, so a failed test's own log is printed.
count_targets() {  # $1: the bazel test log; $2: a label; $3: bazel's exit status; $4: its --config
  local log=$1 what=$2 rc=$3 config=$4 target verdict rest n=0 before=$failed testlogs test_log
  testlogs=$(cbazel info --config="$config" "${extra[@]}" bazel-testlogs 2>/dev/null)
  while read -r target verdict rest; do
    n=$((n + 1))
    if [ "$verdict" = PASSED ]; then
      passed=$((passed + 1))
    else
      failed=$((failed + 1)); echo "FAIL $what $target ($verdict${rest:+ $rest})"
      test_log="$testlogs/${target#//}"; test_log="${test_log/://}/test.log"
      if [ -f "$test_log" ]; then
        echo "---- the last 60 lines of $target's log"; tail -n 60 "$test_log" | sed 's/^/    /'
      fi
    fi
  done < <(grep -E "^//[^ ]+ +(PASSED|FAILED|TIMEOUT|NO STATUS|FAILED TO BUILD)" "$log")
  echo "$what: $n test targets"
  if [ "$rc" -ne 0 ] && [ "$failed" -eq "$before" ]; then
    failed=$((failed + 1)); tail -n 20 "$log"; echo "FAIL $what (bazel exited with $rc)"
  fi
  return 0
}

echo "== clang-14 build, thread-safety analysis (--config=asan, which adds ASan + UBSan and libFuzzer's instrumentation)"
if cbazel build --config=asan "${extra[@]}" //common/... //server/... //worker/... //bench/advise/... \
     >"$logs/clang-build.log" 2>&1; then
  passed=$((passed + 1)); echo "PASS clang build"
else
  failed=$((failed + 1))
  grep -E "error:" "$logs/clang-build.log" | head -n 20 || tail -n 20 "$logs/clang-build.log"
  echo "FAIL clang build"
fi
phase_time "clang build"

fuzz_targets=(chunk_wire_fuzz ucx_framing_fuzz codec_decode_fuzz checkpoint_decode_fuzz
              push_message_fuzz shard_store_fuzz)
fuzz_labels=()
for target in "${fuzz_targets[@]}"; do fuzz_labels+=("//tests/fuzz:${target}_libfuzzer"); done
start=$SECONDS
cbazel build --config=fuzz "${extra[@]}" "${fuzz_labels[@]}" >"$logs/fuzz-build.log" 2>&1
echo "fuzz build: $((SECONDS - start)) s"
phase_time "fuzz build"

echo "== unit and integration tests under ASan + UBSan (--config=asan)"
cbazel test --config=asan "${extra[@]}" --nocache_test_results --build_tests_only \
  --keep_going --test_tag_filters=-no_sanitizers,-manual //tests/... >"$logs/asan-test.log" 2>&1
count_targets "$logs/asan-test.log" asan $? asan
phase_time "asan tests"

# Each target from a copy of its committed corpus, so the run's finds stay
# out of the tree. A crash input is copied next to the logs.
echo "== libFuzzer targets, ${fuzz_seconds} s each (--config=fuzz)"
fuzz_bin="$(cbazel info --config=fuzz bazel-bin 2>/dev/null)/tests/fuzz"
for target in "${fuzz_targets[@]}"; do
  work="$logs/fuzz-$target"; mkdir -p "$work/corpus"
  cp tests/fuzz/corpus/"$target"/* "$work/corpus/"
  if [ -x "$fuzz_bin/${target}_libfuzzer" ] &&
     "$fuzz_bin/${target}_libfuzzer" -max_total_time="$fuzz_seconds" -print_final_stats=1 \
       -artifact_prefix="$work/" "$work/corpus" >"$work/log" 2>&1; then
    passed=$((passed + 1))
    echo "PASS fuzz $target ($(grep -E '^stat::number_of_executed_units' "$work/log" | awk '{print $2}') runs)"
  else
    failed=$((failed + 1))
    grep -E "ERROR|SUMMARY|runtime error|Test unit written" "$work/log" | head -n 10 ||
      tail -n 20 "$logs/fuzz-build.log"
    echo "FAIL fuzz $target"
  fi
done
phase_time "fuzzers"

echo "== unit tests under TSan (--config=tsan, //tests:unit_tests)"
cbazel test --config=tsan "${extra[@]}" --nocache_test_results --keep_going //tests:unit_tests \
  >"$logs/tsan-test.log" 2>&1
count_targets "$logs/tsan-test.log" tsan $? tsan
phase_time "tsan tests"

# The second Bazel server gives its memory back.
cbazel shutdown >/dev/null 2>&1 || true
echo "logs: $logs"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
