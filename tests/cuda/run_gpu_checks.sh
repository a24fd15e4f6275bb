#!/bin/bash
# Runs the CUDA codec and MLP tests and a short GPU codec bench on a GPU
# machine and writes their output to the directory $1. Expects the binaries
# already built with
#   bazel build --config=cuda //cuda/... //tests/cuda/... //tests/bench/cuda/... \
#     //worker/workload/cuda/... //worker:harrier-worker
# (run from the repository root, or set HARRIER_BIN to the bazel-bin folder).
# Total time budget: under 4 minutes. Exit status: 0 if the tests passed and
# the bench ran, else the first failure's status.
set -u
out="${1:?usage: run_gpu_checks.sh OUTPUT_DIR}"
mkdir -p "$out"
bin="${HARRIER_BIN:-$(cd "$(dirname "$0")/../.." && pwd)/bazel-bin}"
test_bin="$bin/tests/cuda/codec_gpu_test"
mlp_bin="$bin/tests/cuda/mlp_gpu_test"
bench_bin="$bin/tests/bench/cuda/codec_gpu_bench"
status=0
for f in "$test_bin" "$mlp_bin" "$bench_bin"; do
  if [[ ! -x "$f" ]]; then
    echo "missing $f (build with --config=cuda first)" | tee -a "$out/summary.txt"
    exit 3
  fi
done
nvidia-smi > "$out/nvidia-smi.txt" 2>&1 || true

timeout 120 "$test_bin" -r junit -o "$out/codec_gpu_test.xml" \
  > "$out/codec_gpu_test.log" 2>&1
rc=$?
# A readable copy as well (console reporter, failures only).
echo "codec_gpu_test exit $rc" | tee -a "$out/summary.txt"
[[ $rc -ne 0 ]] && status=$rc

timeout 60 "$mlp_bin" -r junit -o "$out/mlp_gpu_test.xml" \
  > "$out/mlp_gpu_test.log" 2>&1
rc=$?
echo "mlp_gpu_test exit $rc" | tee -a "$out/summary.txt"
[[ $rc -ne 0 && $status -eq 0 ]] && status=$rc

timeout 50 "$bench_bin" --sizes=1000000,16000000 --min_time=0.05 \
  > "$out/codec_gpu_bench.jsonl" 2> "$out/codec_gpu_bench.err"
rc=$?
echo "codec_gpu_bench exit $rc ($(wc -l < "$out/codec_gpu_bench.jsonl") lines)" \
  | tee -a "$out/summary.txt"
[[ $rc -ne 0 && $status -eq 0 ]] && status=$rc
exit $status
