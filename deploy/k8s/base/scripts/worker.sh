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

# shellcheck source=common.sh
. "$(dirname "$0")/common.sh"

worker_job
check_memlock

exec "${BIN_DIR:-/usr/local/bin}/harrier-worker" --servers="${servers}" \
  --rank="${rank}" --metrics_port=9100 "$@"
