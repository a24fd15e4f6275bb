#!/usr/bin/env bash
# Checks that an emulated link is full duplex for raw TCP: two hosts joined
# by one veth pair with tbf at --rate_gbps on both ends; one stream alone,
# then one stream each way at once, each direction's rate printed in GB/s.
# Needs root. Usage: duplex_check.sh [--rate_gbps=1] [--seconds=2]
set -euo pipefail
rate=1; seconds=2
for arg in "$@"; do
  case $arg in
    --rate_gbps=*) rate=${arg#*=} ;;
    --seconds=*) seconds=${arg#*=} ;;
    -h|--help) sed -n '2,5p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "duplex_check: unknown argument '$arg' (see --help)" >&2; exit 2 ;;
  esac
done
[ "$(id -u)" -eq 0 ] || { echo "duplex_check: needs root (network namespaces)" >&2; exit 3; }
prefix="hdx$$"
cleanup() { ip netns del "${prefix}a" 2>/dev/null || true; ip netns del "${prefix}b" 2>/dev/null || true; }
trap cleanup EXIT
ip netns add "${prefix}a"; ip netns add "${prefix}b"
ip link add "${prefix}x" netns "${prefix}a" type veth peer name "${prefix}y" netns "${prefix}b"
ip -n "${prefix}a" addr add 10.196.0.1/24 dev "${prefix}x"
ip -n "${prefix}b" addr add 10.196.0.2/24 dev "${prefix}y"
ip -n "${prefix}a" link set "${prefix}x" up; ip -n "${prefix}b" link set "${prefix}y" up
burst=$(awk -v r="$rate" 'BEGIN { b = r * 1e9 / 8 * 0.002; if (b < 262144) b = 262144; printf "%d", b }')
for side in a:x b:y; do
  ns="${prefix}${side%%:*}"; dev="${prefix}${side##*:}"
  ip netns exec "$ns" tc qdisc replace dev "$dev" root tbf rate "${rate}gbit" burst "$burst" latency 10ms
done
stream=$(mktemp); trap 'cleanup; rm -f "$stream"' EXIT
cat > "$stream" <<'PY'
import socket, sys, threading, time
role, nbytes, both = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "both"
chunk = b"x" * (1 << 20)
def send(sock):
    left = nbytes
    while left > 0:
        left -= sock.send(chunk[:min(left, len(chunk))])
    sock.shutdown(socket.SHUT_WR)
def receive(sock, name):
    got, start = 0, time.time()
    while True:
        data = sock.recv(1 << 20)
        if not data:
            break
        got += len(data)
    if got:
        print("%s received %.3f GB/s" % (name, got / (time.time() - start) / 1e9))
if role == "server":
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("10.196.0.1", 5999)); listener.listen(1)
    sock, _ = listener.accept()
    reader = threading.Thread(target=receive, args=(sock, "host a"))
    reader.start()
    if both:
        send(sock)
    else:
        sock.shutdown(socket.SHUT_WR)
    reader.join()
else:
    for _ in range(50):
        try:
            sock = socket.create_connection(("10.196.0.1", 5999), timeout=30)
            break
        except OSError:
            time.sleep(0.1)
    reader = threading.Thread(target=receive, args=(sock, "host b"))
    reader.start(); send(sock); reader.join()
PY
nbytes=$(awk -v r="$rate" -v s="$seconds" 'BEGIN { printf "%d", r * 1e9 / 8 * s }')
for mode in one both; do
  echo "$mode direction(s):"
  ip netns exec "${prefix}a" timeout 120 python3 "$stream" server "$nbytes" "$mode" &
  server_pid=$!
  ip netns exec "${prefix}b" timeout 120 python3 "$stream" client "$nbytes" "$mode"
  wait "$server_pid"
done
