#!/usr/bin/env bash
# docs/results.md and docs/results/ from one command (grid, advisor, report):
#
#   bench/scripts/results.sh [--quick] [--grid_dir=DIR] [--docs_dir=docs]
#       [--skip_grid] [--skip_advise] [--grid_arg=FLAG ...]
#       [--bench_binary=PATH] [--advise_binary=PATH] [--server_binary=PATH]
#       [--worker_binary=PATH] [--help]
#
# 1. harrier-bench convergence --out_dir=DIR (resumable: kill it and rerun,
#    finished runs are kept). DIR defaults to $HOME/.cache/harrier-results/grid,
#    with --quick to $HOME/.cache/harrier-results/quick (a small grid: MLP,
#    BSP and local SGD, codecs none, topk and efsign, 1 and 10 Gbit/s, 200 steps).
#    Needs root (network namespaces), as harrier-bench tta.
# 2. harrier-advise --json --calibration=DIR/runs.jsonl per model and link of
#    the grid, against 2 harrier-server shards behind an emulated link of that
#    rate (two namespaces, a veth pair, tbf on both ends; root). Without root
#    the shards are on loopback and results.md says which rate was measured.
#    With --colocated_cores=$(nproc): the grid ran every worker and shard on
#    this host's cores. Writes DIR/advice-<model>-<link>g.jsonl and
#    DIR/advise_machine.txt (where and when it ran).
# 3. bench/scripts/convergence_report.py: DOCS/results.md, DOCS/results/.
#
# --skip_grid: use the grid already in DIR. --skip_advise: use the
# DIR/advice-*.jsonl already there. --grid_arg=FLAG: passed on to the grid
# (e.g. --grid_arg=--models=mlp). Binaries default to bazel-bin/ (build:
# bazel build -c opt //bench:harrier-bench //bench/advise:harrier-advise).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
quick=0
grid_dir=""
docs_dir="$root/docs"
skip_grid=0
skip_advise=0
grid_status=0
grid_args=()
bench="$root/bazel-bin/bench/harrier-bench"
advise="$root/bazel-bin/bench/advise/harrier-advise"
server="$root/bazel-bin/server/harrier-server"
worker=""
for arg in "$@"; do
  case "$arg" in
    --quick) quick=1 ;;
    --grid_dir=*) grid_dir="${arg#*=}" ;;
    --docs_dir=*) docs_dir="${arg#*=}" ;;
    --skip_grid) skip_grid=1 ;;
    --skip_advise) skip_advise=1 ;;
    --grid_arg=*) grid_args+=("${arg#*=}") ;;
    --bench_binary=*) bench="${arg#*=}" ;;
    --advise_binary=*) advise="${arg#*=}" ;;
    --server_binary=*) server="${arg#*=}" ;;
    --worker_binary=*) worker="${arg#*=}" ;;
    --help|-h) sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "results.sh: unknown argument $arg (see --help)" >&2; exit 2 ;;
  esac
done
if [ -z "$grid_dir" ]; then
  if [ "$quick" = 1 ]; then grid_dir="$HOME/.cache/harrier-results/quick"; else grid_dir="$HOME/.cache/harrier-results/grid"; fi
fi
mkdir -p "$grid_dir" "$docs_dir"
python=/usr/bin/python3
[ -x "$python" ] || python=python3

# The full grid is the bench's defaults. The quick one: a few
# configurations, a few hundred steps (12800 examples / 4 workers / batch 64
# = 50 steps an epoch), a target the MLP reaches in that budget.
quick_grid=(--models=mlp --syncs=bsp,local4 --codecs=none,topk,efsign --pulls=off --links=1,10
  --epochs=4 --train_examples=12800 --eval_every=10 --targets=mlp:0.75 --run_timeout_s=300)

need_binary() {  # path name build-target subcommand(optional)
  if [ ! -x "$1" ]; then
    echo "results.sh: $2 not found at $1; build it: bazel build -c opt $3" >&2
    exit 2
  fi
}

if [ "$skip_grid" = 0 ]; then
  need_binary "$bench" harrier-bench //bench:harrier-bench
  # Until the convergence subcommand lands, say what the binary offers.
  if ! "$bench" convergence --help >/dev/null 2>&1; then
    echo "results.sh: $bench has no working 'convergence' subcommand; its --help:" >&2
    "$bench" --help >&2 || true
    exit 2
  fi
  args=(convergence --out_dir="$grid_dir" --resume=true)
  [ "$quick" = 1 ] && args+=("${quick_grid[@]}")
  [ -x "$server" ] && args+=(--server_binary="$server")
  [ -n "$worker" ] && args+=(--worker_binary="$worker")
  args+=("${grid_args[@]}")
  echo "results.sh: harrier-bench ${args[*]}" >&2
  # A grid resumed with other flags (e.g. another --models subset) keeps the
  # record of every invocation that wrote into it; a new grid starts both files.
  verb=resumed
  if [ ! -s "$grid_dir/runs.jsonl" ]; then
    verb=started
    : >"$grid_dir/grid_args.txt"
    : >"$grid_dir/machine.txt"
  fi
  cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
  mem=$(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)
  echo "${args[*]}" >>"$grid_dir/grid_args.txt"
  echo "$(uname -n): $(nproc) CPUs ($cpu), $mem, Linux $(uname -r); grid $verb $(date -u '+%Y-%m-%d %H:%M UTC')" \
    >>"$grid_dir/machine.txt"
  # A grid with failed runs still gets its report (they are listed as
  # failed); the bench's status is this script's at the end.
  "$bench" "${args[@]}" >/dev/null || grid_status=$?
  [ "$grid_status" = 0 ] || echo "results.sh: harrier-bench convergence exited $grid_status; reporting what the grid holds" >&2
fi
[ -s "$grid_dir/runs.jsonl" ] || [ -s "$grid_dir/runs.csv" ] || {
  echo "results.sh: no grid in $grid_dir (runs.jsonl / runs.csv)" >&2; exit 2; }

# (model, link) pairs of the grid's ok runs: the advisor runs once for each.
read -r -a pairs <<<"$("$python" -c '
import json, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
print(" ".join(sorted({"%s:%g" % (r["model"], float(r["link_gbps"])) for r in runs if r.get("status") == "ok"})))' \
  "$grid_dir/runs.jsonl" 2>/dev/null || true)"

netns_ok() { [ "$(id -u)" = 0 ] && command -v ip >/dev/null && command -v tc >/dev/null; }
ns_w="harrier-adv-w$$"
ns_s="harrier-adv-s$$"
shard_pids=()
work=$(mktemp -d)
cleanup() {
  for pid in "${shard_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${shard_pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  shard_pids=()
  ip netns del "$ns_w" 2>/dev/null || true
  ip netns del "$ns_s" 2>/dev/null || true
}
trap 'cleanup; rm -rf "$work"' EXIT

# Two namespaces joined by a veth pair, each end shaped to $1 Gbit/s
# (0: unshaped): the advisor's host and the shards' host.
make_link() {
  ip netns add "$ns_w" && ip netns add "$ns_s"
  ip link add "hvw$$" netns "$ns_w" type veth peer name "hvs$$" netns "$ns_s"
  ip -n "$ns_w" addr add 10.213.0.1/24 dev "hvw$$"
  ip -n "$ns_s" addr add 10.213.0.2/24 dev "hvs$$"
  for ns in "$ns_w:hvw$$" "$ns_s:hvs$$"; do
    ip -n "${ns%%:*}" link set lo up
    ip -n "${ns%%:*}" link set "${ns#*:}" up
    if [ "$1" != 0 ]; then
      # The grid's own burst (bench/netem): max(256 KiB, 2 ms of the
      # rate), so a probe measures the rate, not the bucket.
      local burst
      burst=$(awk -v g="$1" 'BEGIN { b = g * 1e9 / 8 * 0.002; if (b < 262144) b = 262144; printf "%d", b }')
      tc -n "${ns%%:*}" qdisc add dev "${ns#*:}" root tbf rate "${1}gbit" burst "$burst" latency 50ms
    fi
  done
}

advise_one() {  # model link out
  local model=$1 link=$2 out=$3 prefix=() host=127.0.0.1 servers="" portfile i
  if netns_ok; then
    make_link "$link"
    prefix=(ip netns exec "$ns_s")
    host=10.213.0.2
  else
    echo "results.sh: not root (or no ip/tc): the advisor measures loopback, not ${link} Gbit/s" >&2
  fi
  for i in 0 1; do
    portfile="$work/port$i"
    rm -f "$portfile"
    "${prefix[@]}" "$server" --host="$host" --port=0 --port_file="$portfile" --shard="$i" --num_shards=2 \
      --num_workers=4 --sync=bsp >"$work/shard$i.log" 2>&1 &
    shard_pids+=($!)
  done
  for i in 0 1; do
    portfile="$work/port$i"
    for _ in $(seq 100); do [ -s "$portfile" ] && break; sleep 0.1; done
    [ -s "$portfile" ] || { echo "results.sh: shard $i did not start in 10 s: $(tail -n 3 "$work/shard$i.log")" >&2; exit 1; }
    servers+="${servers:+,}$host:$(cat "$portfile")"
  done
  # The options the grid measured for this model, so that every pick can be
  # checked against a measured run (--measured_only: a grid that is no full
  # cross product leaves the others out rather than guessing them).
  local sets
  sets=$("$python" -c '
import json, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
runs = [r for r in runs if r.get("status") == "ok" and r.get("model") == sys.argv[2]]
pulls = sorted({r["run_id"].split("-pull")[-1].split("-")[0] for r in runs})
def ordered(key):
    seen = []
    for r in runs:
        if r[key] not in seen: seen.append(r[key])
    return ",".join(seen)
print(ordered("sync"), ordered("codec"), ",".join(pulls))' "$grid_dir/runs.jsonl" "$model")
  read -r syncs codecs pulls <<<"$sets"
  local run=("$advise" --servers="$servers" --model="$model" --calibration="$grid_dir/runs.jsonl"
    --syncs="$syncs" --codecs="$codecs" --pulls="$pulls" --measured_only --json
    --colocated_cores="$(nproc)")
  if netns_ok; then run=(ip netns exec "$ns_w" "${run[@]}"); fi
  echo "results.sh: ${run[*]}" >&2
  timeout 600 "${run[@]}" >"$out.tmp"
  mv "$out.tmp" "$out"
  cleanup
}

if [ "$skip_advise" = 0 ]; then
  need_binary "$advise" harrier-advise //bench/advise:harrier-advise
  need_binary "$server" harrier-server //server:harrier-server
  # What --help prints says whether the binary is the advisor.
  if ! grep -q -- "--calibration" <<<"$("$advise" --help 2>&1 || true)"; then
    echo "results.sh: $advise --help failed; its output:" >&2
    "$advise" --help >&2 || true
    exit 2
  fi
  rm -f "$grid_dir"/advice-*.jsonl
  cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
  echo "$(uname -n): $(nproc) CPUs ($cpu), Linux $(uname -r), $(date -u '+%Y-%m-%d %H:%M UTC'), --colocated_cores=$(nproc) (the grid's workers and shards share one host's cores)" \
    >"$grid_dir/advise_machine.txt"
  [ "${#pairs[@]}" -gt 0 ] || { echo "results.sh: the grid in $grid_dir has no ok run to advise for" >&2; exit 2; }
  for pair in "${pairs[@]}"; do
    advise_one "${pair%%:*}" "${pair#*:}" "$grid_dir/advice-${pair%%:*}-${pair#*:}g.jsonl"
  done
fi

advice=()
for f in "$grid_dir"/advice-*.jsonl; do [ -e "$f" ] && advice+=(--advice="$f"); done
"$python" "$root/bench/scripts/convergence_report.py" --grid_dir="$grid_dir" --docs_dir="$docs_dir" "${advice[@]}"
echo "results.sh: $docs_dir/results.md (grid in $grid_dir)" >&2
exit "$grid_status"
