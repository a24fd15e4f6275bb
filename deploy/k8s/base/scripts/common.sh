# Shared by server.sh and worker.sh (sourced, POSIX sh).

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
