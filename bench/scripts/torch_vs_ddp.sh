#!/usr/bin/env bash
# The example CNN (examples/torch_fashion_mnist.py) trained through
# harrier.torch against the same model, data order, global batch and
# optimizer under PyTorch DistributedDataParallel over gloo
# (bench/scripts/ddp_torch_cnn.py: no hook, the fp16 hook, PowerSGD rank 2),
# every worker and shard a host of its own on emulated per-host links
# (bench/netem/netem.sh), at each link rate. Needs root.
#
# One JSON line per (link rate, configuration): ms_per_step (training
# steps, evaluations excluded), test_accuracy at the end, the training
# seconds to the first evaluation at or above 0.85 and 0.90 (null if never),
# and the bytes per step each way of a worker's link (its veth counters,
# the mean over workers; Harrier also reports what its client pushed and
# pulled). Then per link rate a summary line: the best of each system by
# ms per step and by time to the last of --targets, and Harrier's ratios to DDP's.
#
#   bench/scripts/torch_vs_ddp.sh [--links_gbps=0.1,1,0] [--workers=4]
#       [--harrier=none@2,none@4,fp16@4@fp16] [--ddp=none,fp16,powersgd]
#       [--epochs=6] [--limit_steps=0] [--eval_every=50] [--targets=0.85,0.90]
#       [--plain_env] [--run_timeout=3600] [--out=FILE]
#
# Every worker and shard of both systems runs with OMP_NUM_THREADS=1,
# OPENBLAS_NUM_THREADS=1 and glibc's MALLOC_MMAP_THRESHOLD_ and
# MALLOC_TRIM_THRESHOLD_ raised (64 and 128 MiB), as a tuned job would;
# --plain_env leaves the environment as it is. --run_timeout: seconds a
# configuration may take; a process still running 60 s after rank 0
# reported its result is killed and named, and the result kept.
#
# --harrier: CODEC@SHARDS[@PULL_CODEC[@TECHNIQUES[@UPDATE[@TRANSPORT[@FUSION[@TAIL]]]]]]
# per configuration (the example's --codec, --pull_codec, --techniques,
# --update, --transport, --fusion_bytes and --forward_order_tail, whose
# default is measure: none pushes each gradient from its hook, all runs the comm
# scheduler; update server (the default) runs the example's optimizer on the
# shards, average averages one fused gradient bucket on the shards and runs
# it on each worker, as DDP does; transport auto (the default: tcp, which
# the shards serve by default), tcp, grpc or ucx (the shards run --ucx and
# UCX uses tcp over each host's link); an empty
# field keeps its default, e.g. none@4@@@average or fp16@4@paired@@average@ucx).
# update worker:H is local SGD: each worker runs the example's optimizer on
# its own batches and the shards (--sync=local --local_steps=H) average the
# models every H steps, e.g. none@4@@@worker:2.
# --ddp: none, fp16, powersgd, or localsgd:H (DDP's post-local SGD from the
# first step, the models averaged every H steps: the same algorithm as
# Harrier's worker:H).
# --links_gbps: 0 is unshaped veth links. --limit_steps cuts each run
# (ms per step only, then). In Debian's torch, gloo inside a namespace needs
# GLOO_SOCKET_IFNAME=eth0 (set here). HARRIER_BIN=DIR (holding
# server/harrier-server and python/pkg) uses those builds instead of
# building with bazel -c opt.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD

if [ "${1:-}" = __run ]; then  # inside netem.sh run: one configuration
  shift
  if [ "${TORCH_VS_DDP_PLAIN_ENV:-0}" = 0 ]; then
    # The same for both systems' processes: one compute thread each (Debian's
    # torch runs OpenBLAS, whose extra thread spins in sched_yield between
    # calls and took about a quarter of each worker's CPU here), and glibc
    # keeping freed tensors' memory instead of unmapping it and faulting it
    # back each step (a quarter of DDP rank 0's CPU in some runs).
    export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MALLOC_MMAP_THRESHOLD_=67108864 \
      MALLOC_TRIM_THRESHOLD_=134217728
  fi
  system=$1 config=$2 workers=$3 dir=$4
  shift 4
  example=("$@")
  ifbytes() { ip netns exec "$1" cat "/sys/class/net/eth0/statistics/$2_bytes"; }
  for ((r = 0; r < workers; r++)); do
    ns_var="NETEM_NS_$r"
    echo "$(ifbytes "${!ns_var}" tx) $(ifbytes "${!ns_var}" rx)" >"$dir/before$r"
  done
  pids=()
  if [ "$system" = harrier ]; then
    IFS=@ read -r codec shards pull_codec techniques update transport fusion tail <<<"$config"
    transport=${transport:-auto}
    # update worker:H is local SGD every H steps; the shards then run --sync=local.
    local_steps=1
    case "$update" in worker:*) local_steps=${update#worker:} update=worker ;; esac
    sync_args=(--sync=bsp)
    [ "$update" = worker ] && sync_args=()
    update_args=(--update="${update:-server}" --local_steps="$local_steps")
    ucx_args=()
    if [ "$transport" = ucx ]; then
      # UCX over each host's own link: its shared-memory transports would
      # cross the namespaces and bypass the emulated links.
      export UCX_TLS=tcp UCX_NET_DEVICES=eth0
      ucx_args=(--ucx)
    fi
    servers=""
    server_args=$(/usr/bin/python3 examples/torch_fashion_mnist.py --print_server_args \
      "${update_args[@]}" "${example[@]}")
    for ((i = 0; i < shards; i++)); do
      ns_var="NETEM_NS_$((workers + i))" addr_var="NETEM_ADDR_$((workers + i))"
      # shellcheck disable=SC2086
      ip netns exec "${!ns_var}" "$HARRIER_BIN/server/harrier-server" --shard=$i \
        --num_shards="$shards" --num_workers="$workers" --port=7000 --host=0.0.0.0 \
        "${sync_args[@]}" "${ucx_args[@]}" $server_args >"$dir/shard$i.log" 2>&1 &
      pids+=($!)
      servers+="${servers:+,}${!addr_var}:7000"
    done
    for ((i = 0; i < shards; i++)); do
      ns_var="NETEM_NS_$((workers + i))"
      for ((t = 0; t < 200; t++)); do
        ip netns exec "${!ns_var}" bash -c 'exec 3<>/dev/tcp/127.0.0.1/7000' 2>/dev/null && break
        sleep 0.1
      done
    done
    for ((r = 0; r < workers; r++)); do
      ns_var="NETEM_NS_$r"
      ip netns exec "${!ns_var}" /usr/bin/python3 examples/torch_fashion_mnist.py --mode=worker \
        --servers="$servers" --rank=$r --num_workers="$workers" --codec="$codec" \
        --pull_codec="${pull_codec:-none}" --techniques="${techniques:-none}" \
        "${update_args[@]}" --transport="$transport" --fusion_bytes="${fusion:-0}" \
        --forward_order_tail="${tail:-measure}" "${example[@]}" \
        >"$dir/out$r" 2>"$dir/err$r" &
      pids+=($!)
    done
  else
    port=$((20000 + RANDOM % 10000))
    hook_args=(--hook="$config")
    case "$config" in localsgd:*) hook_args=(--hook=localsgd --local_steps="${config#localsgd:}") ;; esac
    for ((r = 0; r < workers; r++)); do
      ns_var="NETEM_NS_$r"
      ip netns exec "${!ns_var}" env MASTER_ADDR="$NETEM_ADDR_0" MASTER_PORT=$port RANK=$r \
        WORLD_SIZE="$workers" GLOO_SOCKET_IFNAME=eth0 /usr/bin/python3 \
        bench/scripts/ddp_torch_cnn.py "${hook_args[@]}" "${example[@]}" \
        >"$dir/out$r" 2>"$dir/err$r" &
      pids+=($!)
    done
  fi
  # Every process has until the deadline; once rank 0 has reported, the
  # others get a grace period to exit (a DDP rank was once seen spinning in
  # its teardown after its peers had gone), then are killed and named.
  deadline=$((SECONDS + ${TORCH_VS_DDP_RUN_TIMEOUT:-3600})) grace_end=0 status=0
  while :; do
    alive=()
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive+=("$pid"); done
    [ ${#alive[@]} -eq 0 ] && break
    if [ "$grace_end" = 0 ] && grep -q '^ms_per_step=' "$dir/out0" 2>/dev/null; then
      grace_end=$((SECONDS + 60))
    fi
    if [ $SECONDS -ge $deadline ] || { [ "$grace_end" != 0 ] && [ $SECONDS -ge "$grace_end" ]; }; then
      why="the ${TORCH_VS_DDP_RUN_TIMEOUT:-3600} s deadline"
      [ $SECONDS -lt $deadline ] && why="60 s after rank 0 reported"
      echo "torch_vs_ddp: $system $config: ${#alive[@]} process(es) still running $why; killed" >&2
      kill -9 "${alive[@]}" 2>/dev/null
      [ $SECONDS -ge $deadline ] && status=1
      break
    fi
    sleep 1
  done
  for pid in "${pids[@]}"; do
    wait "$pid"
    code=$?
    # A process killed past rank 0's report (137) keeps the run's result.
    [ "$code" = 0 ] || { [ "$code" = 137 ] && [ "$grace_end" != 0 ]; } || status=1
  done
  for ((r = 0; r < workers; r++)); do
    ns_var="NETEM_NS_$r"
    echo "$(ifbytes "${!ns_var}" tx) $(ifbytes "${!ns_var}" rx)" >"$dir/after$r"
  done
  exit $status
fi

links=0.1,1,0
workers=4
harrier=none@2,none@4,fp16@4@fp16
ddp=none,fp16,powersgd
epochs=6
limit=0
eval_every=50
out=/dev/null
targets=0.85,0.90
for arg in "$@"; do
  case "$arg" in
    --links_gbps=*) links=${arg#*=} ;;
    --workers=*) workers=${arg#*=} ;;
    --harrier=*) harrier=${arg#*=} ;;
    --ddp=*) ddp=${arg#*=} ;;
    --epochs=*) epochs=${arg#*=} ;;
    --limit_steps=*) limit=${arg#*=} ;;
    --eval_every=*) eval_every=${arg#*=} ;;
    --out=*) out=${arg#*=} ;;
    --targets=*) targets=${arg#*=} ;;
    --plain_env) export TORCH_VS_DDP_PLAIN_ENV=1 ;;
    --run_timeout=*) export TORCH_VS_DDP_RUN_TIMEOUT=${arg#*=} ;;
    -h|--help) awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; exit 0 ;;
    *) echo "torch_vs_ddp: unknown option $arg (see --help)" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" = 0 ] || { echo "torch_vs_ddp: needs root (network namespaces)" >&2; exit 1; }
if [ -z "${HARRIER_BIN:-}" ]; then
  bazel build -c opt //server:harrier-server //python:package >&2
  HARRIER_BIN=$(bazel info -c opt bazel-bin 2>/dev/null)
fi
export HARRIER_BIN PYTHONPATH="$HARRIER_BIN/python/pkg"
example=(--epochs="$epochs" --limit_steps="$limit" --eval_every="$eval_every" --log_every=100000)

field() { sed -n "s/^$1=//p" "$2" | head -n 1; }
# The tail the workers planned (the example prints it with --techniques), or null.
tail_or_null() { if [ -n "$1" ]; then echo "$1"; else echo null; fi; }
# Training seconds at the first evaluation at or above $1 (null if none).
reached() {
  awk -v t="$1" '/eval step=/ { a = ""; s = "";
      for (i = 1; i <= NF; i++) { split($i, kv, "="); if (kv[1] == "test_accuracy") a = kv[2];
                                  if (kv[1] == "train_seconds") s = kv[2] }
      if (a != "" && s != "" && a + 0 >= t + 0) { print s; found = 1; exit } }
    END { if (!found) print "null" }' "$2"
}

IFS=, read -ra rates <<<"$links"
IFS=, read -ra harrier_configs <<<"$harrier"
IFS=, read -ra ddp_hooks <<<"$ddp"
IFS=, read -ra target_list <<<"$targets"
for rate in "${rates[@]}"; do
  summary=$(mktemp)
  runs=()
  for c in "${harrier_configs[@]}"; do runs+=("harrier $c"); done
  for h in "${ddp_hooks[@]}"; do runs+=("ddp $h"); done
  for run in "${runs[@]}"; do
    read -r system config <<<"$run"
    hosts=$workers
    if [ "$system" = harrier ]; then
      IFS=@ read -r _ shards _ <<<"$config"
      hosts=$((workers + shards))
    fi
    dir=$(mktemp -d)
    echo "torch_vs_ddp: $system $config at ${rate} Gbit/s ..." >&2
    if ! bench/netem/netem.sh run --hosts="$hosts" --rate_gbps="$rate" -- \
        "$root/bench/scripts/torch_vs_ddp.sh" __run "$system" "$config" "$workers" "$dir" \
        "${example[@]}"; then
      echo "torch_vs_ddp: $system $config at $rate Gbit/s failed; rank 0's stderr:" >&2
      tail -n 20 "$dir/err0" >&2 || true
      rm -rf "$dir"
      continue
    fi
    steps=$(field steps "$dir/out0")
    up=0 down=0
    for ((r = 0; r < workers; r++)); do
      read -r tx0 rx0 <"$dir/before$r"
      read -r tx1 rx1 <"$dir/after$r"
      up=$((up + tx1 - tx0)) down=$((down + rx1 - rx0))
    done
    extra=""
    if [ "$system" = harrier ]; then
      IFS=@ read -r codec shards pull_codec techniques update transport fusion tail <<<"$config"
      local_steps=$(field local_steps "$dir/out0")
      extra=$(printf ',"codec":"%s","pull_codec":"%s","techniques":"%s","update":"%s","local_steps":%d,"transport":"%s","shards":%d,"fusion_bytes":%d,"forward_order_tail":%s,"client_bytes_pushed_per_step":%.0f,"client_bytes_pulled_per_step":%.0f' \
        "$codec" "${pull_codec:-none}" "${techniques:-none}" "$(field update "$dir/out0")" "${local_steps:-1}" "$(field transport "$dir/out0")" "$shards" "${fusion:-0}" \
        "$(tail_or_null "$(field forward_order_tail "$dir/out0")")" \
        "$(awk -v b="$(field bytes_pushed "$dir/out0")" -v s="$steps" 'BEGIN { print b / s }')" \
        "$(awk -v b="$(field bytes_pulled "$dir/out0")" -v s="$steps" 'BEGIN { print b / s }')")
    else
      local_steps=1
      case "$config" in localsgd:*) local_steps=${config#localsgd:} ;; esac
      extra=$(printf ',"hook":"%s","local_steps":%d' "$config" "$local_steps")
    fi
    to=""
    for t in "${target_list[@]}"; do to+=$(printf ',"seconds_to_%s":%s' "$t" "$(reached "$t" "$dir/err0")"); done
    line=$(printf '{"bench":"torch_vs_ddp","system":"%s","config":"%s","links_gbps":%s,"workers":%d,"steps":%d,"ms_per_step":%s,"test_accuracy":%s%s,"up_bytes_per_step":%.0f,"down_bytes_per_step":%.0f%s}' \
      "$system" "$config" "$rate" "$workers" "$steps" "$(field ms_per_step "$dir/out0")" \
      "$(field test_accuracy "$dir/out0")" "$to" \
      "$(awk -v b=$up -v s="$steps" -v w="$workers" 'BEGIN { print b / s / w }')" \
      "$(awk -v b=$down -v s="$steps" -v w="$workers" 'BEGIN { print b / s / w }')" "$extra")
    echo "$line" | tee -a "$out"
    echo "$line" >>"$summary"
    rm -rf "$dir"
  done
  /usr/bin/python3 - "$summary" "$rate" "${target_list[-1]}" <<'EOF' | tee -a "$out"
import json, sys
runs = [json.loads(line) for line in open(sys.argv[1])]
def best(system, key):
    have = [r for r in runs if r["system"] == system and r[key] is not None]
    return min(have, key=lambda r: r[key]) if have else None
out = {"bench": "torch_vs_ddp", "summary": True, "links_gbps": float(sys.argv[2])}
last = "seconds_to_" + sys.argv[3]
for key, name in (("ms_per_step", "ms_per_step"), (last, last)):
    h, d = best("harrier", key), best("ddp", key)
    out[f"harrier_best_{name}"] = h and {"config": h["config"], name: h[key]}
    out[f"ddp_best_{name}"] = d and {"config": d["config"], name: d[key]}
    out[f"harrier_over_ddp_{name}"] = round(h[key] / d[key], 3) if h and d else None
print(json.dumps(out))
EOF
  rm -f "$summary"
done
