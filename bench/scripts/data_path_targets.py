#!/usr/bin/env python3
"""The data path's targets from one data_path_targets.sh run: reached or not.

Reads grpc.jsonl, ucx_tcp.jsonl, ucx_shm.jsonl and codec.jsonl from --dir
and prints one JSON line per target, a table on stderr. A target whose
measurement is missing is reported with "measured": null and reached false.
"""

import argparse
import json
import os
import sys

MIB = 1 << 20


def load(path):
    if not os.path.exists(path):
        return []
    with open(path) as lines:
        return [json.loads(line) for line in lines if line.startswith("{")]


def point(lines, op, size):
    for line in lines:
        if line.get("op") == op and line.get("size_bytes") == size:
            return line
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dir", required=True)
    args = parser.parse_args()
    grpc = load(os.path.join(args.dir, "grpc.jsonl"))
    ucx_tcp = load(os.path.join(args.dir, "ucx_tcp.jsonl"))
    ucx_shm = load(os.path.join(args.dir, "ucx_shm.jsonl"))
    codecs = [c for c in load(os.path.join(args.dir, "codec.jsonl"))
              if c.get("elements") == 25000000]
    sizes = sorted({l["size_bytes"] for l in grpc + ucx_tcp if l["size_bytes"] >= MIB})

    targets = []  # (name, measured, goal, higher_is_better, note)

    def add(name, measured, goal, higher=True, note=""):
        targets.append((name, measured, goal, higher, note))

    for transport, lines, goal in (("grpc", grpc, 0.8), ("ucx_tcp", ucx_tcp, 0.9)):
        for op in ("push", "pull"):
            for size in sizes:
                p = point(lines, op, size)
                add(f"{transport} {op} {size // MIB} MiB / raw TCP",
                    p["ratio"] if p else None, goal)
    for op in ("push", "pull"):
        p = point(ucx_shm, op, 16 * MIB)
        add(f"shared memory {op} 16 MiB / memcpy", p["memcpy_ratio"] if p else None, 0.7)
    for transport, lines, goal in (("grpc", grpc, 100.0), ("ucx_tcp", ucx_tcp, 30.0)):
        p = point(lines, "pushpull", 4096)
        add(f"{transport} 4 KiB push-pull p50 us", p["p50_us"] if p else None, goal, higher=False)
    for codec in codecs:
        name = codec["codec"].split(":")[0]
        if name == "none":
            continue
        goal = 0.3 if name in ("sign", "qsgd") else 0.1
        add(f"{codec['codec']} encode / memcpy, d=25M", codec["encode_ratio"], goal)
    wanted = {"topk": "topk:ratio=0.01", "qsgd": None, "sign": None, "powersgd": None}
    for codec in codecs:
        name = codec["codec"].split(":")[0]
        if name in wanted and (wanted[name] is None or codec["codec"] == wanted[name]):
            add(f"{codec['codec']} breakeven Gbit/s, d=25M", codec["breakeven_gbps"], 10.0)

    reached_count = 0
    for name, measured, goal, higher, _ in targets:
        reached = measured is not None and (measured >= goal if higher else measured <= goal)
        reached_count += reached
        print(json.dumps({"bench": "target", "target": name, "measured": measured,
                          "goal": goal, "better": "higher" if higher else "lower",
                          "reached": reached}))
        shown = "missing" if measured is None else f"{measured:.3f}"
        print(f"{'REACHED' if reached else 'short  '}  {name:48s} {shown:>10s}  goal "
              f"{'>=' if higher else '<='} {goal}", file=sys.stderr)
    print(f"{reached_count} of {len(targets)} targets reached", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
