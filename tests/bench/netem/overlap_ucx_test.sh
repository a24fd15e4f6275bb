#!/usr/bin/env bash
# The UCX data path between emulated hosts: one real worker and one real
# shard, each in its own network namespace on the same machine, UCX_TLS left
# unset (UCX's default). A process in another network namespace is another
# host, so the endpoint must use the network (tcp, with peer-failure
# detection), not shared memory; before it did, large sends between the
# namespaces stalled and the worker gave up after 30 s. Replayed ResNet-50
# (102 MB each way a step), unshaped links, every parameter checked exactly
# by the bench. Prints SKIPPED where namespaces cannot be made (not root).
set -uo pipefail
root="$TEST_SRCDIR/${TEST_WORKSPACE:-harrier}"
bench="$root/bench/harrier-bench"
tmp="${TEST_TMPDIR:-/tmp}"
out="$tmp/overlap_ucx.jsonl"
err="$tmp/overlap_ucx.err"

env -u UCX_TLS -u UCX_NET_DEVICES "$bench" overlap --models=resnet50 --links_gbps=0 \
  --workers=1 --shards=1 --compute_scale=0 --steps=2 --warmup_steps=1 --techniques=all \
  --server_flags=--ucx --worker_flags=--transport=ucx --run_timeout_s=90 \
  >"$out" 2>"$err"
rc=$?
if [ "$rc" -eq 3 ]; then
  echo "SKIPPED: $(grep -m1 'unavailable' "$err")"
  exit 0
fi
cat "$err" >&2
cat "$out"
failed=0
check() {  # check OK DESCRIPTION
  if [ "$1" = 1 ]; then echo "PASS $2"; else echo "FAIL $2"; failed=$((failed + 1)); fi
}
check "$([ "$rc" -eq 0 ] && echo 1)" "harrier-bench overlap over UCX exited 0 (got $rc)"
check "$(grep -q '"checked":true' "$out" && echo 1)" "the run's parameters were checked exactly"
check "$(grep -q '"bytes_pushed_per_iter":10222' "$out" && echo 1)" \
  "a step pushed ResNet-50's 102 MB"
check "$(grep -q 'sends stalled' "$err" || echo 1)" "no UCX send stalled"
echo "$failed failed"
[ "$failed" -eq 0 ]
