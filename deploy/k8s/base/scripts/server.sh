#!/bin/sh
# Entrypoint of a harrier-server pod (mounted from the ConfigMap
# harrier-scripts). Runs shard SHARD_INDEX with the ConfigMap's settings
# (HARRIER_* in the environment) and the container's args appended.
#
# Environment (set by the manifests through the downward API):
#   SHARD_INDEX      the shard this pod serves (JobSet: the job-index
#                    annotation; plain Jobs: the completion index)
#   RUN_ID           the uid of the object whose life is one training run
#                    (the JobSet, or the server Job); a pod that finds its
#                    own RUN_ID in the checkpoint folder is a retry of this
#                    run and resumes it, anything else starts a fresh run
#   RESTART_ATTEMPT  JobSet's restart-attempt label (> 0: resume)
#   MEMLOCK_CHECK    warn (default) or error: what a small `ulimit -l` does
#   BIN_DIR          where the binaries are (default /usr/local/bin)
set -eu

. "$(dirname "$0")/common.sh"

case "${SHARD_INDEX:-}" in
  '' | *[!0-9]*) die "SHARD_INDEX='${SHARD_INDEX:-}' is not a shard number (downward API missing?)" ;;
esac
check_memlock

# A fresh run by default: the server gives every run its own job id and
# checkpoint folder (--checkpoint_dir/job-<id>/). Only a retry of the same
# run (a JobSet restart, a shard pod recreated by its Job) resumes it.
resume=""
if [ "${RESTART_ATTEMPT:-0}" != "" ] && [ "${RESTART_ATTEMPT:-0}" != 0 ]; then
  resume="--resume"
fi
dir="${HARRIER_CHECKPOINT_DIR:-}"
if [ -n "${dir}" ] && [ -n "${RUN_ID:-}" ]; then
  marker="${dir}/.harrier-run-id"
  if [ -f "${marker}" ] && [ "$(cat "${marker}")" = "${RUN_ID}" ]; then
    resume="--resume"
  fi
  printf '%s\n' "${RUN_ID}" > "${marker}.tmp" && mv "${marker}.tmp" "${marker}"
fi
[ -z "${resume}" ] || log "resuming the newest checkpointed run (RUN_ID=${RUN_ID:-} RESTART_ATTEMPT=${RESTART_ATTEMPT:-0})"

exec "${BIN_DIR:-/usr/local/bin}/harrier-server" --shard="${SHARD_INDEX}" \
  --port=50051 --tcp_port=50052 --metrics_port=9100 --health_port=8081 --exit_when_done=true \
  ${resume} "$@"
