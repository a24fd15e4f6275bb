#!/usr/bin/env bash
# Runs every Harrier test: installs what is missing, builds, runs the Bazel
# tests (unit, integration, end-to-end), compiles the CUDA kernels when nvcc
# exists, runs the clang-14 checks (thread-safety analysis, the tests under
# ASan + UBSan and under TSan, the libFuzzer targets: deploy/test_clang.sh),
# validates the Kubernetes manifests, and ends with one line "N passed, M failed"
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

# Each phase's wall time, so a slow run says where its time went.
phase_start=$SECONDS
phase_time() { echo "time $1: $((SECONDS - phase_start)) s wall"; phase_start=$SECONDS; }

echo "== bazel test //..."
bazel test //... --nocache_test_results 2>&1 | tee "$logs/bazel-test.log" | \
  grep -E "^//|^FAIL|^ERROR|Executed|passes|fails" || true
build_rc=${PIPESTATUS[0]}
testlogs=$(bazel info bazel-testlogs 2>/dev/null)
while read -r target verdict; do
  log="$testlogs/${target#//}"; log="${log/://}/test.log"
  if [ -f "$log" ]; then count_log "$log" "$verdict"; else failed=$((failed + 1)); fi
  # CI keeps only this output: a failure's own log is what makes it diagnosable.
  if [ "$verdict" != PASSED ] && [ -f "$log" ]; then
    echo "---- the last 60 lines of $target's log"; tail -n 60 "$log" | sed 's/^/    /'
  fi
done < <(grep -E "^//[^ ]+ +(PASSED|FAILED|TIMEOUT|NO STATUS|FAILED TO BUILD)" "$logs/bazel-test.log" |
         awk '{v=$2; if (v=="FAILED" && $3=="TO") v="FAILED_TO_BUILD"; print $1, v}')
if [ "$build_rc" -ne 0 ] && [ "$failed" -eq 0 ]; then
  echo "bazel test exited with $build_rc"; failed=$((failed + 1))
fi
phase_time "bazel test"

if [ -x /usr/local/cuda/bin/nvcc ]; then
  echo "== CUDA kernels compile and link (nvcc, no GPU needed)"
  if bazel build --config=cuda //cuda/... //tests/cuda/... //bench/cuda/... \
       //worker/workload/cuda/... //worker:harrier-worker //bench/advise:harrier-advise //python:package \
       >"$logs/cuda-build.log" 2>&1; then
    passed=$((passed + 1)); echo "PASS cuda build"
  else
    failed=$((failed + 1)); tail -n 20 "$logs/cuda-build.log"; echo "FAIL cuda build"
  fi
  phase_time "cuda build"
fi

# clang-14 (deploy/test_clang.sh): one build with -Werror=thread-safety,
# ASan + UBSan and libFuzzer's instrumentation serves the thread-safety
# check, the unit and integration tests under ASan + UBSan (one check per
# test target) and the libFuzzer targets (30 s each); TSan, a build of its
# own, runs the unit tests. Its own output base; its Bazel server is shut
# down afterwards to give its memory back.
./deploy/test_clang.sh 2>&1 | tee "$logs/clang.log" | grep -v -E "^[0-9]+ passed, [0-9]+ failed$"
clang_line=$(grep -E "^[0-9]+ passed, [0-9]+ failed$" "$logs/clang.log" | tail -n 1)
if [[ $clang_line =~ ^([0-9]+)\ passed,\ ([0-9]+)\ failed ]]; then
  passed=$((passed + BASH_REMATCH[1])); failed=$((failed + BASH_REMATCH[2]))
else
  failed=$((failed + 1)); echo "FAIL clang checks (no summary line)"
fi
phase_time "clang checks"

echo "== Kubernetes manifests (offline validation)"
# The cross-reference checks read the --help of the binaries built above.
k8s_bin=$(bazel info bazel-bin 2>/dev/null)
if tests/k8s/install.sh && tests/k8s/validate.sh ${k8s_bin:+--bin_dir "$k8s_bin"} > "$logs/k8s.log" 2>&1; then :; fi
cat "$logs/k8s.log"
phase_time "k8s checks"
k8s_line=$(grep -E "^[0-9]+ passed, [0-9]+ failed" "$logs/k8s.log" | tail -n 1)
if [[ $k8s_line =~ ^([0-9]+)\ passed,\ ([0-9]+)\ failed ]]; then
  passed=$((passed + BASH_REMATCH[1])); failed=$((failed + BASH_REMATCH[2]))
else
  failed=$((failed + 1))
fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
