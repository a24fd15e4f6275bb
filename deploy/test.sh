#!/usr/bin/env bash
# Runs every Harrier test: installs what is missing, builds, runs the Bazel
# tests (unit, integration, end-to-end), compiles the CUDA kernels when nvcc
# exists, builds once more with clang-14's thread-safety analysis, validates
# the Kubernetes manifests, and ends with one line "N passed, M failed"
# summing all test cases.
set -uo pipefail
cd "$(dirname "$0")/.."

./deploy/setup.sh || { echo "setup failed"; echo "0 passed, 1 failed"; exit 1; }

passed=0
failed=0
logs=$(mktemp -d "${TMPDIR:-/tmp}/harrier-test.XXXXXX")
count_log() {  # adds one test log's Catch2 case counts (or the target's verdict)
  local log=$1 verdict=$2 line p f
  line=$(grep -E "^All tests passed \(|^test cases:" "$log" | tail -n 1)
  if [[ $line =~ ^All\ tests\ passed\ \(.*\ in\ ([0-9]+)\ test\ case ]]; then
    p=${BASH_REMATCH[1]}; f=0
  elif [[ $line =~ ^test\ cases:\ +([0-9]+)\ \|\ +([0-9]+)\ passed\ \|\ +([0-9]+)\ failed ]]; then
    p=${BASH_REMATCH[2]}; f=${BASH_REMATCH[3]}
  elif [[ $line =~ ^test\ cases:\ +([0-9]+)\ \|\ +([0-9]+)\ failed ]]; then
    p=0; f=${BASH_REMATCH[2]}
  elif line=$(grep -E "^[0-9]+ checks passed, [0-9]+ failed" "$log" | tail -n 1) &&
       [[ $line =~ ^([0-9]+)\ checks\ passed,\ ([0-9]+)\ failed ]]; then
    p=${BASH_REMATCH[1]}; f=${BASH_REMATCH[2]}
  elif [ "$verdict" = PASSED ]; then
    p=1; f=0
  else
    p=0; f=1
  fi
  # A target that failed (crash, timeout) after its cases passed still fails.
  if [ "$verdict" != PASSED ] && [ "$f" -eq 0 ]; then f=1; fi
  passed=$((passed + p)); failed=$((failed + f))
}

echo "== bazel test //..."
bazel test //... --nocache_test_results 2>&1 | tee "$logs/bazel-test.log" | \
  grep -E "^//|^FAIL|^ERROR|Executed|passes|fails" || true
build_rc=${PIPESTATUS[0]}
testlogs=$(bazel info bazel-testlogs 2>/dev/null)
while read -r target verdict; do
  log="$testlogs/${target#//}"; log="${log/://}/test.log"
  if [ -f "$log" ]; then count_log "$log" "$verdict"; else failed=$((failed + 1)); fi
done < <(grep -E "^//[^ ]+ +(PASSED|FAILED|TIMEOUT|NO STATUS|FAILED TO BUILD)" "$logs/bazel-test.log" |
         awk '{v=$2; if (v=="FAILED" && $3=="TO") v="FAILED_TO_BUILD"; print $1, v}')
if [ "$build_rc" -ne 0 ] && [ "$failed" -eq 0 ]; then
  echo "bazel test exited with $build_rc"; failed=$((failed + 1))
fi

if [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "== CUDA kernels compile and link (nvcc, no GPU needed)"
  if bazel build --config=cuda //cuda/... //tests/cuda/... //tests/bench/cuda/... \
       //worker/workload/cuda/... //worker:harrier-worker >"$logs/cuda-build.log" 2>&1; then
    passed=$((passed + 1)); echo "PASS cuda build"
  else
    failed=$((failed + 1)); tail -n 20 "$logs/cuda-build.log"; echo "FAIL cuda build"
  fi
fi

# One check: clang-14 compiles common/, server/ and worker/ with
# -Werror=thread-safety (see .bazelrc). Its own output base, because a
# compiler switch would otherwise throw away the gcc build's outputs; the
# second Bazel server is shut down afterwards to give its memory back.
echo "== clang-14 build, thread-safety analysis (--config=clang)"
clang_out="$HOME/.cache/harrier-clang-out"
if ! command -v clang-14 >/dev/null 2>&1; then
  failed=$((failed + 1)); echo "FAIL clang build (clang-14 not installed)"
elif bazel --output_base="$clang_out" build --config=clang //common/... //server/... //worker/... \
       >"$logs/clang-build.log" 2>&1; then
  passed=$((passed + 1)); echo "PASS clang build"
else
  failed=$((failed + 1))
  grep -E "error:" "$logs/clang-build.log" | head -n 20 || tail -n 20 "$logs/clang-build.log"
  echo "FAIL clang build"
fi
# ASan + UBSan (--config=asan) and TSan (--config=tsan) are run by hand
# for now (README.md, "Building and testing by hand"): cold, they take about
# 31 and 23 minutes on 2 cores, past this run's budget.
#
# libFuzzer, in the clang output base above (--config=fuzz has its own
# --platform_suffix): each target 30 s from its committed corpus (copied,
# so the run's finds stay out of the tree), one check each. A crash input
# is copied next to the logs.
echo "== libFuzzer targets, 30 s each (--config=fuzz)"
# shard_store_fuzz is left out until its open finding is diagnosed
# (tests/fuzz/crashes/, tests/fuzz/README.md); its seeds still run as a
# plain test.
fuzz_targets=(chunk_wire_fuzz ucx_framing_fuzz codec_decode_fuzz checkpoint_decode_fuzz
              push_message_fuzz)
start=$SECONDS
fuzz_labels=()
for target in "${fuzz_targets[@]}"; do fuzz_labels+=("//tests/fuzz:${target}_libfuzzer"); done
bazel --output_base="$clang_out" build --config=fuzz "${fuzz_labels[@]}" >"$logs/fuzz-build.log" 2>&1
echo "fuzz build: $((SECONDS - start)) s"
fuzz_bin="$(bazel --output_base="$clang_out" info --config=fuzz bazel-bin 2>/dev/null)/tests/fuzz"
for target in "${fuzz_targets[@]}"; do
  work="$logs/fuzz-$target"; mkdir -p "$work/corpus"
  cp tests/fuzz/corpus/"$target"/* "$work/corpus/"
  if [ -x "$fuzz_bin/${target}_libfuzzer" ] &&
     "$fuzz_bin/${target}_libfuzzer" -max_total_time=30 -print_final_stats=1 \
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
bazel --output_base="$clang_out" shutdown >/dev/null 2>&1 || true

echo "== Kubernetes manifests (offline validation)"
if tests/k8s/install.sh && tests/k8s/validate.sh > "$logs/k8s.log" 2>&1; then :; fi
cat "$logs/k8s.log"
k8s_line=$(grep -E "^[0-9]+ passed, [0-9]+ failed" "$logs/k8s.log" | tail -n 1)
if [[ $k8s_line =~ ^([0-9]+)\ passed,\ ([0-9]+)\ failed ]]; then
  passed=$((passed + BASH_REMATCH[1])); failed=$((failed + BASH_REMATCH[2]))
else
  failed=$((failed + 1))
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
