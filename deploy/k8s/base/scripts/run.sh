#!/bin/sh
# Entrypoint of a worker pod that runs your own image and command instead
# of harrier-worker (components/own-command; mounted from the ConfigMap
# harrier-scripts, like worker.sh). Puts the job into the environment, the
# way harrier-launch does for a command, then execs the container's args:
#
#   HARRIER_SERVERS     every shard's address, shard 0 first:
#                       ${SERVER_PREFIX}<i>${SERVER_SUFFIX} for i in
#                       0..HARRIER_NUM_SHARDS-1
#   HARRIER_RANK        JOB_COMPLETION_INDEX (the Indexed Job's pod index)
#   HARRIER_LOCAL_RANK  0, HARRIER_LOCAL_SIZE 1 (one worker per pod)
#
# HARRIER_NUM_SHARDS, HARRIER_NUM_WORKERS, HARRIER_TLS_CA, HARRIER_TLS_CERT,
# HARRIER_TLS_KEY and HARRIER_AUTH_TOKEN_FILE come from the ConfigMap
# harrier-config as they are. The image needs /bin/sh.
#
# Environment:
#   SERVER_PREFIX, SERVER_SUFFIX  as for worker.sh
#   MEMLOCK_CHECK    warn (default) or error: what a small `ulimit -l` does
set -eu

# shellcheck source=common.sh
. "$(dirname "$0")/common.sh"

[ "$#" -gt 0 ] || die "no command to run: give it as the container's args, e.g. [python3, /app/train.py]"
worker_job
check_memlock

HARRIER_SERVERS="${servers}"
HARRIER_RANK="${rank}"
HARRIER_LOCAL_RANK=0
HARRIER_LOCAL_SIZE=1
export HARRIER_SERVERS HARRIER_RANK HARRIER_LOCAL_RANK HARRIER_LOCAL_SIZE
exec "$@"
