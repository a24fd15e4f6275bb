# Shared by server.sh, worker.sh and run.sh (sourced, POSIX sh).

log() { printf '%s: %s\n' "$(basename "$0")" "$*" >&2; }
die() { log "error: $*"; exit 2; }

# RDMA (UCX) registers buffers, which needs a high RLIMIT_MEMLOCK. Pods get
# it from the container runtime: the IPC_LOCK capability would not help,
# since a non-root container holds added capabilities in its bounding set
# only. Below 1 GiB: a warning, or with MEMLOCK_CHECK=error (the gpu-rdma
# overlay) an error before the binary starts.
check_memlock() {
  mode="${MEMLOCK_CHECK:-warn}"
  [ "${mode}" = off ] && return 0
  limit="$(ulimit -l)"
  [ "${limit}" = unlimited ] && return 0
  case "${limit}" in '' | *[!0-9]*) limit=0 ;; esac
  [ "${limit}" -ge 1048576 ] && return 0
  msg="locked-memory limit is ${limit} KiB (ulimit -l); UCX over RDMA needs 'unlimited': set LimitMEMLOCK=infinity for the container runtime on this node (deploy/k8s/README.md, Locked memory)"
  case "${mode}" in
    error) die "${msg}" ;;
    warn) log "warning: ${msg}" ;;
    *) die "MEMLOCK_CHECK='${mode}' (want warn, error or off)" ;;
  esac
}

# A worker pod's rank and the shards' addresses, checked: the rank is
# JOB_COMPLETION_INDEX (the Indexed Job's pod index); shard i is
# ${SERVER_PREFIX}${i}${SERVER_SUFFIX}, e.g. harrier-server-0-0.harrier:50051
# (JobSet) or harrier-server-0.harrier-server:50051 (plain Jobs), for i in
# 0..HARRIER_NUM_SHARDS-1. Sets rank and servers (comma-separated, shard 0
# first).
worker_job() {
  case "${JOB_COMPLETION_INDEX:-}" in
    '' | *[!0-9]*) die "JOB_COMPLETION_INDEX='${JOB_COMPLETION_INDEX:-}' is not a rank (not an Indexed Job?)" ;;
  esac
  case "${HARRIER_NUM_SHARDS:-}" in
    '' | *[!0-9]* | 0) die "HARRIER_NUM_SHARDS='${HARRIER_NUM_SHARDS:-}' is not a positive shard count" ;;
  esac
  [ -n "${SERVER_PREFIX:-}" ] && [ -n "${SERVER_SUFFIX:-}" ] || die "SERVER_PREFIX and SERVER_SUFFIX must be set"
  rank="${JOB_COMPLETION_INDEX}"
  servers=""
  i=0
  while [ "${i}" -lt "${HARRIER_NUM_SHARDS}" ]; do
    servers="${servers:+${servers},}${SERVER_PREFIX}${i}${SERVER_SUFFIX}"
    i=$((i + 1))
  done
}
