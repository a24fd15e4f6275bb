#!/bin/bash
# netem.sh: emulated links by hand, the same topology as the C++ library
# (emulated_network.h). Needs root.
#
#   netem.sh run [--hosts=2] [--rate_gbps=1] [--model=per_host|shared] -- COMMAND...
#       builds the network, runs COMMAND in the caller's namespace with
#       NETEM_HOSTS, NETEM_NS_<i> (namespace of host i) and NETEM_ADDR_<i>
#       (its address) exported, then removes everything (also on Ctrl-C).
#       Run a process inside host i with: ip netns exec "$NETEM_NS_i" ...
#   netem.sh clean      removes namespaces left by a killed run (prefix hsh).
#
# Per-host: one namespace per host, each with a veth to a bridge namespace,
# tbf on both ends (host egress = upload, bridge egress = download), hosts
# 10.199.0.(i+1)/24. Shared: one namespace whose loopback is shaped; every
# host is 127.0.0.1 there. tbf burst = max(256 KiB, 2 ms of the rate),
# latency 10 ms, as in TbfParamsFor.
set -euo pipefail

prefix=hsh
usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; }

[ $# -ge 1 ] || { usage >&2; exit 2; }
cmd=$1; shift
case "$cmd" in
  --help|-h|help) usage; exit 0 ;;
  clean)
    for ns in $(ip netns list | awk '{print $1}' | grep "^${prefix}" || true); do
      ip netns del "$ns"
    done
    exit 0 ;;
  run) ;;
  *) echo "netem.sh: unknown command '$cmd'" >&2; usage >&2; exit 2 ;;
esac

hosts=2 rate=1 model=per_host
while [ $# -gt 0 ]; do
  case "$1" in
    --hosts=*) hosts=${1#*=} ;;
    --rate_gbps=*) rate=${1#*=} ;;
    --model=*) model=${1#*=} ;;
    --) shift; break ;;
    *) echo "netem.sh: unknown flag '$1'" >&2; exit 2 ;;
  esac
  shift
done
[ $# -ge 1 ] || { echo "netem.sh run: no command after --" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "netem.sh: needs root (network namespaces)" >&2; exit 1; }
case "$model" in per_host|shared) ;; *) echo "netem.sh: --model must be per_host or shared" >&2; exit 2 ;; esac

base="${prefix}$$"
made=()
cleanup() { for ns in "${made[@]}"; do ip netns del "$ns" 2>/dev/null || true; done; }
trap cleanup EXIT INT TERM

shape() {  # namespace device
  [ "$(awk "BEGIN{print ($rate > 0)}")" = 1 ] || return 0
  local burst
  burst=$(awk "BEGIN{b=$rate*1e9/8*0.002; if (b < 262144) b = 262144; printf \"%d\", b}")
  tc -n "$1" qdisc replace dev "$2" root tbf rate "$(awk "BEGIN{printf \"%d\", $rate*1e9}")bit" \
    burst "${burst}b" latency 10ms
}
add_ns() { ip netns add "$1"; made+=("$1"); ip -n "$1" link set lo up; }

export NETEM_HOSTS=$hosts
if [ "$model" = shared ]; then
  add_ns "${base}-s"; shape "${base}-s" lo
  for ((i = 0; i < hosts; i++)); do
    export "NETEM_NS_$i=${base}-s" "NETEM_ADDR_$i=127.0.0.1"
  done
else
  br="${base}-b"; add_ns "$br"
  ip -n "$br" link add br0 type bridge; ip -n "$br" link set br0 up
  for ((i = 0; i < hosts; i++)); do
    ns="${base}-h$i"; add_ns "$ns"
    ip -n "$br" link add "p$i" type veth peer name eth0 netns "$ns"
    ip -n "$br" link set "p$i" master br0; ip -n "$br" link set "p$i" up
    ip -n "$ns" addr add "10.199.0.$((i + 1))/24" dev eth0; ip -n "$ns" link set eth0 up
    shape "$ns" eth0; shape "$br" "p$i"
    export "NETEM_NS_$i=$ns" "NETEM_ADDR_$i=10.199.0.$((i + 1))"
  done
fi
"$@"
