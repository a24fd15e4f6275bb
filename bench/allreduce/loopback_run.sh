#!/usr/bin/env bash
# Runs WORLD ranks of harrier-allreduce-replay on 127.0.0.1 (no shaping) with
# a fresh rendezvous directory and prints every rank's replay_summary line,
# rank 0 first; ranks' stderr goes to stderr. Exits non-zero if any rank did.
#   bench/allreduce/loopback_run.sh 2 --model=resnet50 --compute_scale=0.1 --steps=6
# BIN overrides the binary (default: bazel-bin's).
set -uo pipefail
if [ $# -lt 1 ] || [ "$1" = --help ]; then
  echo "usage: $0 WORLD [harrier-allreduce-replay flags...]" >&2
  exit 2
fi
world=$1
shift
bin=${BIN:-bazel-bin/bench/allreduce/harrier-allreduce-replay}
dir=$(mktemp -d /tmp/allreduce-loopback.XXXXXX)
trap 'rm -rf "$dir"' EXIT
mkdir "$dir/rendezvous"
pids=()
for ((r = 0; r < world; r++)); do
  timeout 600 "$bin" --rank="$r" --world="$world" --rendezvous_dir="$dir/rendezvous" \
    --address=127.0.0.1 "$@" >"$dir/$r.out" 2>"$dir/$r.err" &
  pids+=($!)
done
rc=0
for ((r = 0; r < world; r++)); do
  wait "${pids[$r]}" || { rc=1; echo "rank $r failed: $(tail -n 1 "$dir/$r.err")" >&2; }
  cat "$dir/$r.out"
done
exit "$rc"
