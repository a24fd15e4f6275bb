#!/usr/bin/env python3
"""Where a process's CPU goes, per GB it moved: a perf profile's samples
sorted into framing (gRPC, HTTP/2, protobuf), CRC, copies, apply, zeroing
and allocation, wake-ups, locks, the kernel's TCP/IP and the rest.

Each sample goes to the first category that matches walking its call chain
from the leaf up (so a copy inside sendmsg counts as a copy, the rest of
sendmsg as TCP/IP, and a sample in user code gRPC's own as framing).

    perf record -F 499 -g -p PID -o worker.data -- sleep 5
    bench/scripts/cpu_profile.py --hz=499 --gb=0.82 worker.data

--gb is what the process sent and received during the recording (from
harrier-bench overlap: the recording's seconds / iter_ms x bytes_per_iter);
without it the shares are printed in per cent. docs/performance.md, "CPU
per byte", shows its use.
"""
import argparse
import collections
import re
import subprocess
import sys

RULES = [
    ("CRC", r"Crc32c|crc32_iscsi"),
    ("apply", r"Avx2Block|AverageInPlace|FusedStep|RunFused|Sgd|SumFloats|BucketReducer::Loop"),
    ("copies", r"memmove|memcpy|_copy_from_iter|_copy_to_iter|copy_user|skb_copy_datagram|"
               r"__skb_datagram_iter"),
    ("zeroing, allocation", r"memset|malloc|_int_free|cfree|sysmalloc|clear_page|handle_mm_fault|"
                            r"do_anonymous_page|unlink_chunk"),
    # libc's syscall() is how absl and gRPC call futex: a sample there is
    # the system call's entry and return.
    ("wake-ups", r"^schedule|__schedule|futex|try_to_wake_up|epoll_wait|ep_poll|"
                 r"finish_task_switch|nanosleep|hrtimer|Waiter::|CondVar|\bsyscall \("),
    ("locks", r"Mutex::|GraphCycles|spin_lock"),
    ("kernel TCP/IP", r"tcp_|ip_|net_rx_action|handle_softirqs|veth|sock_|skb|__netif|dev_|tbf|"
                      r"sch_|inet_|__sys_sendmsg|__sys_recvmsg|recvfrom|sendto"),
]
FRAMING = r"grpc|chttp2|gpr_|hpack|protobuf|DecodeChunk|EncodeChunk|libgrpc|libgpr|libprotobuf"
ORDER = ["framing (gRPC, HTTP/2, protobuf)", "CRC", "copies", "apply", "zeroing, allocation",
         "wake-ups", "locks", "kernel TCP/IP", "other"]


def chains(path):
    out = subprocess.run(["perf", "script", "-i", path, "-F", "ip,sym,dso"],
                         capture_output=True, text=True, check=True).stdout
    for block in out.strip().split("\n\n"):
        yield [line.strip() for line in block.splitlines() if line.strip()]


def categorise(frames):
    first_user = next((i for i, f in enumerate(frames) if "kernel.kallsyms" not in f), None)
    for i, frame in enumerate(frames):
        for name, pattern in RULES:
            if re.search(pattern, frame):
                return name
        if i == first_user:
            return ORDER[0] if re.search(FRAMING, frame) else "other"
    return "other"


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", nargs="+", help="perf.data files")
    parser.add_argument("--hz", type=float, default=499, help="perf record -F")
    parser.add_argument("--gb", type=float, default=0, help="GB the process moved while recorded")
    args = parser.parse_args()
    for path in args.data:
        counts = collections.Counter(categorise(frames) for frames in chains(path))
        total = sum(counts.values())
        if total == 0:
            print(f"{path}: no samples")
            continue
        if args.gb > 0:
            print(f"{path}: {total / args.hz / args.gb:.2f} CPU s per GB ({total} samples)")
        else:
            print(f"{path}: {total} samples")
        for name in ORDER:
            share = counts.get(name, 0)
            value = (f"{share / args.hz / args.gb:5.2f} s/GB" if args.gb > 0
                     else f"{100 * share / total:5.1f} %")
            print(f"  {name:34s} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
