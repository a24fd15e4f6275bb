#!/usr/bin/env bash
# Harrier's default data path against ps-lite on loopback, one server and
# one worker each, alternated round by round in one run:
#   - ps-lite as built (ZPush/ZPull over its zmq van, an SGD handler), and
#     again with glibc's malloc tuned as Harrier tunes its own processes
#     (common/process.cc: mmap threshold 32 MiB, trim threshold 1 GiB, one
#     arena);
#   - harrier-bench transport (tcp), without and with --staging_buffers
#     (the comm scheduler's and harrier.torch's path).
# Pushes and pulls of 4 KiB, 1 MiB and 16 MiB; one JSON line per point in
# OUT_DIR/pslite_compare.jsonl, then the medians and the per-round ratios.
#
# usage: bench/scripts/pslite_compare.sh PSLITE_DIR OUT_DIR [ROUNDS]
#   PSLITE_DIR: a checkout of github.com/dmlc/ps-lite (built here with the
#   system's protoc, protobuf and libzmq: apt install protobuf-compiler
#   libprotobuf-dev libzmq3-dev). Harrier's binaries: bazel build -c opt
#   //bench:harrier-bench //server:harrier-server.
set -euo pipefail
if [[ $# -lt 2 || "$1" == --help || "$1" == -h ]]; then
  sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'
  exit $([[ $# -lt 2 ]] && echo 2 || echo 0)
fi
pslite=$(cd "$1" && pwd)
out=$2
rounds=${3:-3}
here=$(cd "$(dirname "$0")/../.." && pwd)
bench=$here/bazel-bin/bench/harrier-bench
[[ -x $bench ]] || { echo "no $bench: bazel build -c opt //bench:harrier-bench //server:harrier-server" >&2; exit 2; }
mkdir -p "$out/pslite-build"
build=$out/pslite-build
echo "building ps-lite from $pslite into $build" >&2
protoc --cpp_out="$build" --proto_path="$pslite/src" "$pslite/src/meta.proto"
objects=()
for src in "$pslite"/src/*.cc "$build/meta.pb.cc"; do
  obj=$build/$(basename "$src" .cc).o
  g++ -std=c++17 -O3 -fPIC -I"$pslite/include" -I"$pslite/src" -I"$build" -c "$src" -o "$obj"
  objects+=("$obj")
done
g++ -std=c++17 -O3 -I"$pslite/include" -I"$build" "$here/bench/scripts/pslite_bench.cc" \
  "${objects[@]}" -o "$build/pslite_bench" -lprotobuf -lzmq -lpthread

jsonl=$out/pslite_compare.jsonl
: >"$jsonl"
tuned="glibc.malloc.mmap_threshold=33554432:glibc.malloc.trim_threshold=1073741824:glibc.malloc.arena_max=1"
run_pslite() {  # tag, GLIBC_TUNABLES, round
  local port=$((9000 + RANDOM % 2000))
  local env=(DMLC_NUM_SERVER=1 DMLC_NUM_WORKER=1 DMLC_PS_ROOT_URI=127.0.0.1
             DMLC_PS_ROOT_PORT=$port GLIBC_TUNABLES=$2)
  env "${env[@]}" DMLC_ROLE=scheduler "$build/pslite_bench" >/dev/null 2>&1 &
  env "${env[@]}" DMLC_ROLE=server "$build/pslite_bench" >/dev/null 2>&1 &
  env "${env[@]}" DMLC_ROLE=worker timeout 300 "$build/pslite_bench" 2>/dev/null |
    sed "s/^{/{\"v\":\"$1\",\"round\":$3,/" >>"$jsonl"
  wait
}
for round in $(seq 1 "$rounds"); do
  echo "round $round of $rounds" >&2
  run_pslite pslite "" "$round"
  run_pslite pslite_tuned "$tuned" "$round"
  for staging in "" --staging_buffers; do
    "$bench" transport --shards=1 --workers=1 --sizes=4K,1M,16M --ops=push,pull \
      --bytes_per_point=2G $staging 2>/dev/null | grep '"op"' |
      sed "s/^{/{\"v\":\"harrier${staging:+_staging}\",\"round\":$round,/" >>"$jsonl"
  done
done
python3 - "$jsonl" "$rounds" <<'PY'
import collections, json, statistics, sys
gbps = collections.defaultdict(dict)
p50 = collections.defaultdict(dict)
for line in open(sys.argv[1]):
    d = json.loads(line)
    if d["op"] not in ("push", "pull"):
        continue
    size = d.get("size_bytes", d.get("bytes"))
    key = (d["op"], size, d["round"])
    gbps[key][d["v"]] = d.get("goodput_gbps", d.get("gbps"))
    p50[key][d["v"]] = d["p50_us"]
rounds = range(1, int(sys.argv[2]) + 1)
tags = ("harrier", "harrier_staging", "pslite", "pslite_tuned")
for op in ("push", "pull"):
    for size in (4096, 1 << 20, 16 << 20):
        cells = []
        for tag in tags:
            g = [gbps[(op, size, r)][tag] for r in rounds]
            p = [p50[(op, size, r)][tag] for r in rounds]
            cells.append(f"{tag} {statistics.median(g):.3f} GB/s p50 {statistics.median(p):.1f} us")
        print(f"{op} {size}: " + "; ".join(cells))
        for h in ("harrier", "harrier_staging"):
            for ps in ("pslite", "pslite_tuned"):
                r = [gbps[(op, size, k)][h] / gbps[(op, size, k)][ps] for k in rounds]
                print(f"  {h} / {ps}: median {statistics.median(r):.2f} (rounds " +
                      ", ".join(f"{x:.2f}" for x in r) + ")")
PY
