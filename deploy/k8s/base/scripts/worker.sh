#!/bin/sh
# Entrypoint of a harrier-worker pod (mounted from the ConfigMap
# harrier-scripts). Runs rank JOB_COMPLETION_INDEX (the Indexed Job's pod
# index) against every shard, shard 0 first, with the ConfigMap's settings
# (HARRIER_* in the environment) and the container's args appended.
#
# Environment:
#   SERVER_PREFIX, SERVER_SUFFIX  shard i's address is
#                    ${SERVER_PREFIX}${i}${SERVER_SUFFIX}, e.g.
#                    harrier-server-0-0.harrier:50051 (JobSet) or
#                    harrier-server-0.harrier-server:50051 (plain Jobs)
#   MEMLOCK_CHECK    warn (default) or error: what a small `ulimit -l` does
#   BIN_DIR          where the binaries are (default /usr/local/bin)
set -eu

. "$(dirname "$0")/common.sh"

case "${JOB_COMPLETION_INDEX:-}" in
  '' | *[!0-9]*) die "JOB_COMPLETION_INDEX='${JOB_COMPLETION_INDEX:-}' is not a rank (not an Indexed Job?)" ;;
esac
case "${HARRIER_NUM_SHARDS:-}" in
  '' | *[!0-9]* | 0) die "HARRIER_NUM_SHARDS='${HARRIER_NUM_SHARDS:-}' is not a positive shard count" ;;
esac
[ -n "${SERVER_PREFIX:-}" ] && [ -n "${SERVER_SUFFIX:-}" ] || die "SERVER_PREFIX and SERVER_SUFFIX must be set"
check_memlock

servers=""
i=0
while [ "${i}" -lt "${HARRIER_NUM_SHARDS}" ]; do
  servers="${servers:+${servers},}${SERVER_PREFIX}${i}${SERVER_SUFFIX}"
  i=$((i + 1))
done

exec "${BIN_DIR:-/usr/local/bin}/harrier-worker" --servers="${servers}" \
  --rank="${JOB_COMPLETION_INDEX}" --metrics_port=9100 "$@"
