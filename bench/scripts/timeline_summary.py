#!/usr/bin/env python3
"""Summarises worker timelines (harrier-worker --timeline, Chrome traces).

    timeline_summary.py TIMELINE.json [MORE.json ...]

For each step of the first file (one worker): its length, when its pushes
began and ended, when the pulls of the next step's parameters ended (the
"pull tail" is how long they ran on after the last push), the bytes each
way, the median time a pull waited in the scheduler's queue, and the time
the training loop waited for parameters. Times are in ms from the start
of the step.

With the timelines of every worker of a BSP run, also the rounds: a pull
is answered once every worker's push of its piece is in, so for each pull
of the first worker, how long after its own push the last worker's push of
that piece ended (median and maximum per step). Large values mean the
workers pushed the pieces in different orders.

A timeline without the comm scheduler's steps (harrier-worker without
--techniques, harrier.torch's default path, a harrier.Client's own calls)
is summarised by operation instead: for each operation name, how many
there were, their median, 90th percentile and total time, the time the
caller's waits on them took, and the median share of an operation still
to run when a wait on it began (near 1: the caller waited for all of it;
near 0: it had overlapped with other work).
"""

import collections
import json
import statistics
import sys


def load(path):
    with open(path) as f:
        return json.load(f)


def spans(events, category):
    """The comm scheduler's spans of `category` (they carry their step)."""
    return [e for e in events
            if e.get("ph") == "X" and e.get("cat") == category and "step" in e.get("args", {})]


def percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def by_operation(path, events):
    """The client's operations of a timeline without steps, by name."""
    calls = [e for e in events
             if e.get("ph") == "X" and e.get("cat") != "wait" and "operation" in e.get("args", {})]
    waits = {e["args"]["operation"]: e for e in events
             if e.get("ph") == "X" and e.get("cat") == "wait" and "operation" in e.get("args", {})}
    groups = collections.defaultdict(list)
    for e in calls:
        groups[(e["cat"], e["name"])].append(e)
    print(f"# {path}: the client's operations, times in ms")
    header = ("count", "med", "p90", "total", "waited", "still_to_run", "operation")
    print(" ".join(f"{h:>12}" for h in header[:-1]), header[-1])
    for (category, name), group in sorted(groups.items(), key=lambda kv: -sum(e["dur"] for e in kv[1])):
        durations = [e["dur"] / 1e3 for e in group]
        waited = [waits[e["args"]["operation"]] for e in group if e["args"]["operation"] in waits]
        shares = [(e["ts"] + e["dur"] - waits[e["args"]["operation"]]["ts"]) / max(1, e["dur"])
                  for e in group if e["args"]["operation"] in waits]
        row = [len(group), statistics.median(durations), percentile(durations, 0.9),
               sum(durations), sum(w["dur"] for w in waited) / 1e3,
               statistics.median(shares) if shares else 0.0]
        print(" ".join(f"{v:>12.2f}" if isinstance(v, float) else f"{v:>12}" for v in row), name)


def push_ends(events):
    """(piece name, step) -> end of that push, in microseconds."""
    return {(e["name"], e["args"]["step"]): e["ts"] + e["dur"] for e in spans(events, "push")}


def main(paths):
    first = load(paths[0])
    if not spans(first, "step"):
        by_operation(paths[0], first)
        return
    others = [load(p) for p in paths[1:]]
    all_push_ends = [push_ends(first)] + [push_ends(o) for o in others]
    by_step = collections.defaultdict(list)
    for e in spans(first, "push") + spans(first, "pull"):
        by_step[(e["cat"], e["args"]["step"])].append(e)
    waits = spans(first, "wait")
    print(f"# {paths[0]}: times in ms from each step's start")
    header = ("step", "ms", "push_from", "push_to", "pull_to", "pull_tail", "push_MB", "pull_MB",
              "pull_queued_med", "loop_wait")
    if others:
        header += ("round_lag_med", "round_lag_max")
    print(" ".join(f"{h:>15}" for h in header))
    for step_event in sorted(spans(first, "step"), key=lambda e: e["ts"]):
        step = step_event["args"]["step"]
        begin, end = step_event["ts"], step_event["ts"] + step_event["dur"]
        pushes = by_step[("push", step)]
        pulls = by_step[("pull", step + 1)]
        if not pushes or not pulls:
            continue
        ms = lambda t: (t - begin) / 1e3
        push_to = max(e["ts"] + e["dur"] for e in pushes)
        pull_to = max(e["ts"] + e["dur"] for e in pulls)
        row = [step, step_event["dur"] / 1e3, ms(min(e["ts"] for e in pushes)), ms(push_to),
               ms(pull_to), (pull_to - push_to) / 1e3,
               sum(e["args"]["bytes"] for e in pushes) / 1e6,
               sum(e["args"]["bytes"] for e in pulls) / 1e6,
               statistics.median(e["args"]["queued_ms"] for e in pulls),
               sum(e["dur"] for e in waits if begin <= e["ts"] < end) / 1e3]
        if others:
            lags = []
            for e in pulls:
                key = (e["name"], step)
                if all(key in ends for ends in all_push_ends):
                    lags.append((max(ends[key] for ends in all_push_ends) - all_push_ends[0][key]) / 1e3)
            row += [statistics.median(lags) if lags else 0, max(lags) if lags else 0]
        print(" ".join(f"{v:>15.1f}" if isinstance(v, float) else f"{v:>15}" for v in row))


if __name__ == "__main__":
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        sys.exit(0 if len(sys.argv) >= 2 else 2)
    main(sys.argv[1:])
