#!/usr/bin/env bash
# Writes each fuzz target's seeds (its FuzzSeeds(), built with gcc through
# fuzz_driver.cc) to tests/fuzz/corpus/<target>/seed-<i>. Files a fuzzing
# run added there (crash regressions, minimised finds) are kept; the
# seed-<i> files are rewritten.
set -euo pipefail
cd "$(dirname "$0")/../.."
targets=(codec_decode_fuzz checkpoint_decode_fuzz push_message_fuzz chunk_wire_fuzz
         ucx_framing_fuzz shard_store_fuzz)
bazel build "${targets[@]/#/\/\/tests\/fuzz:}"
for target in "${targets[@]}"; do
  mkdir -p "tests/fuzz/corpus/$target"
  "bazel-bin/tests/fuzz/$target" --write_seeds="$PWD/tests/fuzz/corpus/$target"
done
