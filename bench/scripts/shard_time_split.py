#!/usr/bin/env python3
"""Files a shard's perf samples under receive, check, step and reply.

Reads `perf script -F tid,ip,sym` output (call chains, leaf first). A
sample belongs to the first stage a frame of its chain names, walking from
the leaf: a memcpy under the optimizer counts as step, one under the reply
writer as reply. Samples naming none are "other" (gRPC's or UCX's own
framing and polling, locks); "scheduler" is time in the kernel's
context switches (a chain whose leaf is the scheduler). Used by shard_time_split.sh.
"""

import argparse
import json
import re
import sys

# Leaf-first matching, so the order matters only within one frame.
STAGES = [
    # The fused pass does check and step at once: its own stage.
    ("check+step", re.compile(r"Fused|fused_apply")),
    ("check", re.compile(r"Crc32c|crc32c|AllWithin|ValidateChunk|Finite")),
    ("step", re.compile(r"Optimizer|::Step|StepLocked|ApplyLocked|FinishRoundsLocked")),
    ("reply", re.compile(r"ShardStore::Pull|ReplyWriter|ReplySink|PullReactor|"
                         r"tcp_sendmsg|__sys_sendmsg|SendReply|Reply")),
    ("receive", re.compile(r"tcp_recvmsg|__sys_recvmsg|PushReader|DecodeChunk|"
                           r"ReceivedChunk|OnReadDone|Receive|recv_data|AmRecv")),
]
IDLE = re.compile(r"^(schedule|__schedule|finish_task_switch|futex_wait|do_epoll_wait|"
                  r"ep_poll|poll_schedule_timeout|cpuidle|default_idle)")


def parse(lines):
    chain = []
    for line in lines:
        line = line.rstrip("\n")
        if not line.strip():
            if chain:
                yield chain
            chain = []
            continue
        if not line.startswith(("\t", " ")):
            if chain:
                yield chain
            chain = []
            continue
        parts = line.strip().split(None, 1)
        chain.append(parts[1].rsplit(" (", 1)[0] if len(parts) > 1 else "")
    if chain:
        yield chain


def stage_of(chain):
    if chain and IDLE.match(chain[0]):
        return "scheduler"
    # The fused pass calls the CRC per block: a CRC under it is its time.
    if any(STAGES[0][1].search(frame) for frame in chain):
        return STAGES[0][0]
    for frame in chain:
        for name, pattern in STAGES[1:]:
            if pattern.search(frame):
                return name
    return "other"


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--samples", required=True)
    parser.add_argument("--bytes", type=int, required=True, help="bytes the shard read")
    parser.add_argument("--cpu_seconds", type=float, required=True)
    parser.add_argument("--window_seconds", type=float, required=True)
    parser.add_argument("--transport", default="grpc")
    parser.add_argument("--size", default="")
    args = parser.parse_args()

    counts = {}
    with open(args.samples, errors="replace") as samples:
        for chain in parse(samples):
            stage = stage_of(chain)
            counts[stage] = counts.get(stage, 0) + 1
    total = sum(counts.values())
    if total == 0 or args.bytes <= 0:
        print("no samples or no bytes received: did the bench run?", file=sys.stderr)
        return 1
    busy = total
    line = {
        "bench": "shard_time_split",
        "transport": args.transport,
        "size": args.size,
        "samples": total,
        "window_seconds": round(args.window_seconds, 3),
        "shard_cpu_seconds": round(args.cpu_seconds, 3),
        "received_gbps": round(args.bytes / args.window_seconds / 1e9, 4),
        "shard_cpu_ns_per_byte": round(args.cpu_seconds * 1e9 / args.bytes, 4),
    }
    for stage in ["receive", "check", "step", "check+step", "reply", "scheduler", "other"]:
        share = counts.get(stage, 0) / busy if busy else 0.0
        line[f"{stage}_share"] = round(share, 4)
        line[f"{stage}_ns_per_byte"] = round(share * args.cpu_seconds * 1e9 / args.bytes, 4)
    print(json.dumps(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
