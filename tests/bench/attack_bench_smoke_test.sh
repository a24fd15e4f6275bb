#!/usr/bin/env bash
# Smoke test of harrier-attack-bench (bench/attack): a short run (2 s per
# phase, job token, BSP) prints one JSON line with every documented field;
# the shard is still alive after every attack at once, its peak resident set
# stayed within the unattacked one + the budgets + the allowance, and each
# attack met the refusal the shard's limits give it. The steps/s ratio and
# the verdict are not judged here (they need a quiet machine:
# bench/scripts/bench_checks.sh attack).
set -uo pipefail
root="$TEST_SRCDIR/${TEST_WORKSPACE:-harrier}"
bench="$root/bench/attack/harrier-attack-bench"
out="${TEST_TMPDIR:-/tmp}/attack_bench.json"

if ! timeout 120 "$bench" --seconds=2 >"$out"; then
  echo "FAIL harrier-attack-bench exited non-zero"
  exit 1
fi
exec python3 - "$out" <<'PY'
import json, sys
line = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
failed = []
def check(name, ok):
    print(("PASS " if ok else "FAIL ") + name)
    if not ok:
        failed.append(name)
fields = ["rss_idle_mb", "rss_baseline_mb", "rss_peak_mb", "budget_sum_mb", "constant_mb",
          "rss_bound_mb", "rss_within_bound", "steps_per_s_unattacked", "steps_per_s_attacked",
          "ratio", "shard_exit_status", "worker_stalled", "refusals", "verdict",
          "cpus_shard_and_worker", "cpus_attacks", "attacker_exit_status"]
check("every field", all(field in line for field in fields))
check("the shard is alive", line.get("shard_exit_status") == -1)
check("the attacking process ran to its end", line.get("attacker_exit_status") == 0)
cpus_job, cpus_attacks = line.get("cpus_shard_and_worker", []), line.get("cpus_attacks", [])
check("the attacks ran on CPUs of their own (with two or more)",
      (len(cpus_job) + len(cpus_attacks) == 2 and cpus_job == cpus_attacks) or
      not set(cpus_job) & set(cpus_attacks))
check("budget_sum_mb is the four budgets (128 + 16 + 32 + 256)", line.get("budget_sum_mb") == 432)
check("rss_peak_mb %s <= rss_bound_mb %s" % (line.get("rss_peak_mb"), line.get("rss_bound_mb")),
      line.get("rss_within_bound") is True and line["rss_peak_mb"] <= line["rss_bound_mb"])
refusals = line.get("refusals", {})
for name in ["oversized_tensor_name", "oversized_shape", "oversized_codec_spec",
             "oversized_barrier_name", "oversized_worker_name"]:
    check(name + " refused INVALID_ARGUMENT", set(refusals.get(name, {})) == {"INVALID_ARGUMENT"})
check("many_chunks_257 refused RESOURCE_EXHAUSTED",
      set(refusals.get("many_chunks_257", {})) == {"RESOURCE_EXHAUSTED"})
check("many_chunks_named_twice refused INVALID_ARGUMENT",
      set(refusals.get("many_chunks_named_twice", {})) == {"INVALID_ARGUMENT"})
check("many_chunks_256 answered", set(refusals.get("many_chunks_256", {})) == {"OK"})
check("push_streams met --max_buffered_bytes",
      refusals.get("push_streams", {}).get("RESOURCE_EXHAUSTED", 0) > 0)
check("unary_no_token streams all ended by the shard",
      set(refusals.get("unary_no_token", {})) == {"ended_by_shard"})
print(json.dumps(line))
print("%d checks failed" % len(failed))
sys.exit(1 if failed else 0)
PY
