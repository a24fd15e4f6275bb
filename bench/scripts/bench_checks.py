#!/usr/bin/env python3
"""Bench checks: the speed, rate and ranking checks that need a quiet machine.

usage: bench/scripts/bench_checks.sh [links|overlap|advisor|attack|all ...]
           [--bin_dir=bazel-bin] [--work_dir=DIR] [--help]

CI (./deploy/test.sh) asserts only what a loaded machine keeps: values,
and speeds to an order of magnitude. What a busy CPU breaks (a link within
10 % of its rate, a ranking of measured times) is checked here, by hand, on
a machine with nothing else running. Each check prints one JSON line with
"check", its figures and "verdict" ("pass", "fail" or "not_checked" with
"reason"); the last line is {"check": "summary", "verdict": ..., counts}.
Exits 0 when nothing failed, 1 otherwise, 2 on a usage error.

  links    bench/netem's links (measure-link, best of 5 streams each):
           per-host 1 Gbit/s both ways and a shared 1 Gbit/s link within
           10 % of the rate; unshaped more than 2.5x the 1 Gbit/s link;
           10 Gbit/s per-host never above 11 and within 10 % where the
           unshaped stream reaches 20 Gbit/s (else not_checked); two
           concurrent streams each within 10 % on per-host links, the slower
           under 0.8 on one shared link.                      (root, ~1 min)
  overlap  harrier-bench overlap, CI's case (ResNet-50, 2 workers, 2 shards,
           1 Gbit/s, plain and all): the link within 10 % of its rate and no
           iteration faster than 0.9x the cost model's comm_ms. (root, ~1 min)
  advisor  bench/scripts/results.sh --quick into --work_dir, then
           advice_rank_check.py: the advisor's pick among the 3 fastest
           measured runs on each link, or within 10 % of the third (a miss
           is measured once more).                           (root, ~2 min)
  attack   bench/attack's harrier-attack-bench (job token, BSP, 15 s per
           phase): the shard's peak RSS under every memory attack at once
           within its unattacked RSS + the budgets + 256 MiB, the shard
           alive, and the worker's steps/s under attack at least half of
           its steps/s alone (docs/performance.md, "The shard's memory
           under attack").                                 (no root, ~40 s)

Binaries come from --bin_dir (build them first: bazel build -c opt
//bench:harrier-bench //bench/netem:measure-link //bench/advise:harrier-advise
//server:harrier-server //worker:harrier-worker
//bench/attack:harrier-attack-bench).
"""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Checks:
    def __init__(self):
        self.counts = {"pass": 0, "fail": 0, "not_checked": 0}

    def report(self, check, verdict, **figures):
        self.counts[verdict] += 1
        print(json.dumps({"check": check, **figures, "verdict": verdict}), flush=True)


def measure_link(bin_dir, **flags):
    """One measure-link JSON line, or None with the reason on stderr."""
    argv = [os.path.join(bin_dir, "bench/netem/measure-link")]
    for name, value in flags.items():
        argv.append(f"--{name}" if value is True else f"--{name}={value}")
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def within(measured, rate, fraction):
    return abs(measured - rate) <= fraction * rate


def check_links(checks, bin_dir):
    one = {"attempts": 5, "mbytes": 25}
    shaped = -1
    for name, flags in [("link_per_host_1g_up", {"model": "per_host"}),
                        ("link_per_host_1g_down", {"model": "per_host", "reverse": True}),
                        ("link_shared_1g", {"model": "shared"})]:
        line = measure_link(bin_dir, rate_gbps=1, **one, **flags)
        if line is None:
            checks.report(name, "fail", reason="measure-link failed (stderr above)")
            continue
        checks.report(name, "pass" if within(line["measured_gbps"], 1, 0.10) else "fail",
                      rate_gbps=1, measured_gbps=line["measured_gbps"], bound="within 10 %")
        if name == "link_per_host_1g_up":
            shaped = line["measured_gbps"]
    unshaped_line = measure_link(bin_dir, rate_gbps=0, attempts=3, mbytes=250)
    unshaped = unshaped_line["measured_gbps"] if unshaped_line else -1
    checks.report("link_unshaped_vs_1g", "pass" if unshaped > 2.5 * shaped else "fail",
                  unshaped_gbps=unshaped, shaped_1g_gbps=shaped, bound="unshaped > 2.5x shaped")
    line = measure_link(bin_dir, rate_gbps=10, attempts=5, mbytes=250)
    rate10 = line["measured_gbps"] if line else -1
    if rate10 >= 11 or rate10 < 0:
        verdict, reason = "fail", "above 11 Gbit/s (not shaped)" if rate10 >= 11 else "measure-link failed"
    elif unshaped >= 20:
        verdict, reason = ("pass" if within(rate10, 10, 0.10) else "fail"), ""
    else:
        verdict, reason = "not_checked", f"the unshaped stream reached only {unshaped:g} Gbit/s (< 20)"
    checks.report("link_per_host_10g", verdict, rate_gbps=10, measured_gbps=rate10, unshaped_gbps=unshaped,
                  bound="< 11; within 10 % where unshaped >= 20", **({"reason": reason} if reason else {}))
    line = measure_link(bin_dir, rate_gbps=1, model="per_host", pairs=2, attempts=5)
    pairs = line["pairs_gbps"] if line else []
    checks.report("link_per_host_concurrent", "pass" if pairs and all(within(g, 1, 0.10) for g in pairs)
                  else "fail", rate_gbps=1, pairs_gbps=pairs, bound="each within 10 %")
    line = measure_link(bin_dir, rate_gbps=1, model="shared", pairs=2, attempts=1)
    pairs = line["pairs_gbps"] if line else []
    checks.report("link_shared_concurrent", "pass" if pairs and min(pairs) < 0.8 else "fail",
                  rate_gbps=1, pairs_gbps=pairs, bound="the slower < 0.8")


def check_overlap(checks, bin_dir, work_dir):
    out = os.path.join(work_dir, "overlap.jsonl")
    with open(out, "w") as stdout:
        done = subprocess.run([os.path.join(bin_dir, "bench/harrier-bench"), "overlap", "--models=resnet50",
                               "--links_gbps=1", "--compute_scale=0.05", "--steps=2", "--warmup_steps=1",
                               "--techniques=plain,all", "--run_timeout_s=60"],
                              stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=600)
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        checks.report("overlap", "fail", reason=f"harrier-bench overlap exited {done.returncode}")
        return
    for line in (json.loads(l) for l in open(out) if l.strip()):
        t = line["techniques"]
        checks.report(f"overlap_{t}_link", "pass" if within(line["link_measured_gbps"], 1, 0.10) else "fail",
                      rate_gbps=1, measured_gbps=line["link_measured_gbps"], bound="within 10 %")
        checks.report(f"overlap_{t}_iteration", "pass" if line["iter_ms"] >= 0.9 * line["comm_ms"] else "fail",
                      iter_ms=line["iter_ms"], comm_ms=line["comm_ms"], bound="iter_ms >= 0.9 x comm_ms")


def check_advisor(checks, bin_dir, work_dir):
    grid, docs = os.path.join(work_dir, "grid"), os.path.join(work_dir, "docs")
    bench = os.path.join(bin_dir, "bench/harrier-bench")
    done = subprocess.run(["bash", os.path.join(ROOT, "bench/scripts/results.sh"), "--quick",
                           f"--grid_dir={grid}", f"--docs_dir={docs}", f"--bench_binary={bench}",
                           f"--advise_binary={os.path.join(bin_dir, 'bench/advise/harrier-advise')}",
                           f"--server_binary={os.path.join(bin_dir, 'server/harrier-server')}",
                           f"--worker_binary={os.path.join(bin_dir, 'worker/harrier-worker')}"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=3600)
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-4000:])
        checks.report("advisor_rank", "fail", reason=f"results.sh --quick exited {done.returncode}")
        return
    ranked = subprocess.run([sys.executable, os.path.join(ROOT, "bench/scripts/advice_rank_check.py"),
                             f"--grid_dir={grid}", f"--bench_binary={bench}"],
                            capture_output=True, text=True, timeout=3600)
    for text in ranked.stdout.splitlines():
        line = json.loads(text)
        if line.get("check") == "summary":
            continue
        verdict = line.pop("verdict")
        checks.report(line.pop("check"), verdict, **line)


def check_attack(checks, bin_dir):
    done = subprocess.run([os.path.join(bin_dir, "bench/attack/harrier-attack-bench"), "--seconds=15"],
                          capture_output=True, text=True, timeout=600)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        sys.stderr.write(done.stderr[-4000:])
        checks.report("attack", "fail", reason=f"harrier-attack-bench exited {done.returncode}")
        return
    line = json.loads(lines[-1])
    verdict = line.pop("verdict")
    checks.report("attack", verdict, **line,
                  bound="rss_peak <= rss_baseline + budget_sum + constant; shard alive; ratio >= 0.5")


def main(argv):
    bin_dir, work_dir, which = os.path.join(ROOT, "bazel-bin"), None, []
    for arg in argv[1:]:
        if arg.startswith("--bin_dir="):
            bin_dir = os.path.abspath(arg.split("=", 1)[1])
        elif arg.startswith("--work_dir="):
            work_dir = os.path.abspath(arg.split("=", 1)[1])
        elif arg in ("-h", "--help"):
            print(__doc__)
            return 0
        elif arg in ("links", "overlap", "advisor", "attack", "all"):
            which += ["links", "overlap", "advisor", "attack"] if arg == "all" else [arg]
        else:
            print(f"bench_checks: unknown argument {arg} (see --help)", file=sys.stderr)
            return 2
    which = which or ["links", "overlap", "advisor", "attack"]
    checks = Checks()
    for name in dict.fromkeys(which):
        if name == "attack":
            check_attack(checks, bin_dir)
        elif os.geteuid() != 0:
            checks.report(name, "not_checked", reason="needs root (network namespaces)")
        else:
            work_dir = work_dir or tempfile.mkdtemp(prefix="harrier-bench-checks.")
            os.makedirs(work_dir, exist_ok=True)
            {"links": lambda: check_links(checks, bin_dir),
             "overlap": lambda: check_overlap(checks, bin_dir, work_dir),
             "advisor": lambda: check_advisor(checks, bin_dir, work_dir)}[name]()
    verdict = "fail" if checks.counts["fail"] else "pass"
    print(json.dumps({"check": "summary", "verdict": verdict, "passed": checks.counts["pass"],
                      "failed": checks.counts["fail"], "not_checked": checks.counts["not_checked"]}))
    return 1 if verdict == "fail" else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
