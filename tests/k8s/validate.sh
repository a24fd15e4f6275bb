#!/usr/bin/env bash
# Offline validation of Harrier's Kubernetes manifests (deploy/k8s).
#
#   tests/k8s/validate.sh [--bin_dir DIR]
#
# Run tests/k8s/install.sh once first, and build the binaries (bazel build
# //server:harrier-server //server:harrier-ctl //worker:harrier-worker;
# deploy/test.sh builds everything first): their --help texts are what the
# ConfigMap keys and every argument are checked against. DIR is the Bazel
# output folder holding server/ and worker/ (default: `bazel info
# bazel-bin`, else the workspace's bazel-bin link).
# Prints one line per check,
#   PASS <check>   or   FAIL <check>   (followed by the details, indented),
# then "N passed, M failed"; exits 1 if any check failed.
#
# Checks: the binaries' --help texts; yamllint on the sources; for the base
# and every overlay: render with kubectl kustomize, schema (kubernetes-models
# JSON schemas; JobSets against tests/k8s/jobset/v1alpha2.schema.json and
# their Job templates as batch/v1 Jobs), types (TypeScript check against
# the kubernetes-models interfaces and tests/k8s/jobset/v1alpha2.ts: also
# rejects unknown fields), refs (selectors, named ports, mounts, ConfigMap
# keys and arguments against --help), pss (Pod Security baseline and
# restricted), policy (Harrier's rules, and what each overlay promises);
# scaling through the ConfigMap; your own command as the workers
# (overlays/own-command, components/own-command on the plain Jobs, run.sh
# in a shell with the rendered pod's environment); broken fixtures and edits
# that must be rejected; make-secrets.sh; the entrypoints and the TLS
# settings with the real binaries.
set -u

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "${here}/../.." && pwd)"
k8s="${root}/deploy/k8s"
tmp="$(mktemp -d)"
pids=()
cleanup() {
  for p in "${pids[@]+"${pids[@]}"}"; do kill "${p}" 2>/dev/null; done
  rm -rf "${tmp}"
}
trap cleanup EXIT

bin_dir=""
while [ $# -gt 0 ]; do
  case "$1" in
    --bin_dir) bin_dir="${2:-}"; shift 2 ;;
    --bin_dir=*) bin_dir="${1#*=}"; shift ;;
    *) echo "validate.sh: unknown argument '$1' (usage: validate.sh [--bin_dir DIR])" >&2; exit 2 ;;
  esac
done
if [ -z "${bin_dir}" ]; then
  if command -v bazel >/dev/null 2>&1; then
    bin_dir="$(cd "${root}" && timeout 120 bazel info bazel-bin 2>/dev/null)"
  fi
  [ -n "${bin_dir}" ] || bin_dir="${root}/bazel-bin"
fi

passed=0
failed=0

# report STATUS NAME [DETAILS_FILE]
report() {
  if [ "$1" -eq 0 ]; then
    echo "PASS $2"
    passed=$((passed + 1))
  else
    echo "FAIL $2"
    failed=$((failed + 1))
    if [ -n "${3:-}" ] && [ -s "$3" ]; then sed -n '1,40s/^/    /p' "$3"; fi
  fi
}

finish() {
  echo "${passed} passed, ${failed} failed"
  [ "${failed}" -eq 0 ]
  exit $?
}

check() { node "${here}/check.js" --help-dir="${tmp}/help" "$@"; }

# Prerequisites.
missing=""
for tool in kubectl node yamllint; do
  command -v "${tool}" >/dev/null 2>&1 || missing="${missing} ${tool}"
done
[ -d "${here}/node_modules/kubernetes-models" ] || missing="${missing} node_modules"
if [ -n "${missing}" ]; then
  echo "missing:${missing} (run tests/k8s/install.sh)" > "${tmp}/prereq"
  report 1 "prerequisites" "${tmp}/prereq"
  finish
fi
report 0 "prerequisites"

# The binaries' --help texts, from the binaries themselves: the refs check
# takes every flag name from them. A binary that is missing fails here
# (and the checks that need its text fail too).
mkdir -p "${tmp}/help"
for bin in server/harrier-server worker/harrier-worker server/harrier-ctl; do
  name="$(basename "${bin}")"
  if [ ! -x "${bin_dir}/${bin}" ]; then
    echo "${name} not built (${bin_dir}/${bin}; bazel build //${bin%/*}:${name}, or pass --bin_dir)" > "${tmp}/err"
    report 1 "help ${name}: ${name} not built" "${tmp}/err"
    continue
  fi
  # The text is what counts, not the exit status.
  timeout 10 "${bin_dir}/${bin}" --help > "${tmp}/help/${name}.txt" 2>&1
  if grep -qE '^ +--[a-z0-9_]+ \(' "${tmp}/help/${name}.txt"; then
    report 0 "help ${name} ($(grep -cE '^ +--[a-z0-9_]+ \(' "${tmp}/help/${name}.txt") flags from ${bin_dir}/${bin} --help)"
  else
    { echo "no flags in its --help:"; head -n 20 "${tmp}/help/${name}.txt"; } > "${tmp}/err"
    rm -f "${tmp}/help/${name}.txt"
    report 1 "help ${name}" "${tmp}/err"
  fi
done

# Lint the sources (the broken fixtures too: they are broken in content only).
yamllint -s -c "${here}/yamllint.yaml" "${k8s}" "${here}/fixtures/broken" "${here}/fixtures/scaled" \
  "${here}/fixtures/own-command-no-jobset" "${here}/yamllint.yaml" > "${tmp}/lint" 2>&1
report $? "yamllint deploy/k8s" "${tmp}/lint"

# Render and validate the base and every overlay.
# The own-command component is also checked on the plain Jobs
# (fixtures/own-command-no-jobset).
for target in base overlays/cpu overlays/gpu overlays/gpu-rdma overlays/no-jobset overlays/own-command \
    fixtures/own-command-no-jobset; do
  out="${tmp}/$(echo "${target}" | tr / _).yaml"
  dir="${k8s}/${target}"
  case "${target}" in fixtures/*) dir="${here}/${target}" ;; esac
  if ! kubectl kustomize "${dir}" > "${out}" 2> "${tmp}/err"; then
    report 1 "render ${target}" "${tmp}/err"
    continue
  fi
  report 0 "render ${target}"
  overlay=""
  case "${target}" in
    overlays/*) overlay="--overlay=${target#overlays/}" ;;
    fixtures/own-command-*) overlay="--overlay=own-command" ;;
  esac
  for c in schema types refs pss policy; do
    check --check="${c}" ${overlay} "${out}" > "${tmp}/err" 2>&1
    report $? "${c} ${target}" "${tmp}/err"
  done
done

# Scaling is one edit: the ConfigMap's counts drive the JobSet's server
# replicas and worker completions/parallelism.
if kubectl kustomize "${here}/fixtures/scaled" > "${tmp}/scale.yaml" 2> "${tmp}/err"; then
  { check --check=policy --overlay=cpu "${tmp}/scale.yaml" \
      && grep -q '^    replicas: 4$' "${tmp}/scale.yaml" \
      && grep -q '^        completions: 8$' "${tmp}/scale.yaml" \
      && grep -q '^        parallelism: 8$' "${tmp}/scale.yaml"; } > "${tmp}/err" 2>&1
  report $? "scale fixtures/scaled (shards=4 workers=8 via harrier-config)" "${tmp}/err"
else
  report 1 "scale fixtures/scaled (shards=4 workers=8 via harrier-config)" "${tmp}/err"
fi

# expect_reject NAME OUTPUT_FILE STATUS PATTERN...: the check must have
# failed, and its output must name every PATTERN (the planted errors).
expect_reject() {
  local name="$1" out="$2" status="$3"
  shift 3
  if [ "${status}" -eq 0 ]; then
    echo "accepted, but must be rejected" > "${tmp}/why"
    report 1 "${name}" "${tmp}/why"
    return
  fi
  : > "${tmp}/why"
  for pattern in "$@"; do
    grep -q -- "${pattern}" "${out}" || echo "rejected, but not for '${pattern}':" >> "${tmp}/why"
  done
  [ -s "${tmp}/why" ] && cat "${out}" >> "${tmp}/why"
  [ ! -s "${tmp}/why" ]
  report $? "${name}" "${tmp}/why"
}

# reject_fixture DIR CHECK OVERLAY PATTERN...: fixtures/broken/DIR renders
# (kustomize checks no field names or references) but CHECK must reject
# it, naming every PATTERN. Each fixture's kustomization.yaml says what
# it breaks.
reject_fixture() {
  local dir="$1" c="$2" ov="$3"
  shift 3
  local name="reject fixtures/broken/${dir} by ${c}"
  if ! kubectl kustomize "${here}/fixtures/broken/${dir}" > "${tmp}/broken.yaml" 2> "${tmp}/err"; then
    report 1 "${name} (render)" "${tmp}/err"
    return
  fi
  check --check="${c}" ${ov:+--overlay=${ov}} "${tmp}/broken.yaml" > "${tmp}/out" 2>&1
  expect_reject "${name}" "${tmp}/out" $? "$@"
}

# Core types (plain-Job form): unknown field, misspelled field, wrong type.
reject_fixture types schema "" "spec/backoffLimit must be integer"
reject_fixture types types "" \
  "'\"replicaz\"' does not exist in type 'IJobSpec'" \
  "'\"imagePullPolicyy\"' does not exist in type 'IContainer'" \
  "\"backoffLimit\": \"six\".*not assignable to type 'number'"
# The JobSet schema and types, the embedded Job templates as batch/v1.
reject_fixture jobset-fields schema "" \
  "spec/replicatedJobs/0 must NOT have additional properties ('replica')" \
  "spec/replicatedJobs/1/template (as batch/v1 Job): data/spec/backoffLimit must be integer"
reject_fixture jobset-fields types "" \
  "'\"replica\"' does not exist in type 'IReplicatedJob'" \
  "'\"completionsMode\"' does not exist in type 'IJobSpec'" \
  "'\"startupPolicyy\"' does not exist in type 'IJobSetSpec'"
reject_fixture jobset-enums schema "" \
  "/spec/startupPolicy/startupPolicyOrder must be equal to one of the allowed values (AnyOrder, InOrder)" \
  "/spec/successPolicy/operator must be equal to one of the allowed values (All, Any)" \
  "/spec/failurePolicy/maxRestarts must be >= 0"
reject_fixture jobset-enums types "" \
  "\"Inorder\".*not assignable to type '\"AnyOrder\" | \"InOrder\"'" \
  "\"all\".*not assignable to type 'Operator'"
reject_fixture jobset-targets refs "" \
  "successPolicy.targetReplicatedJobs names replicated job 'workers', which does not exist"
# Cross-references.
reject_fixture service-selector refs "" \
  'Service/harrier-server: selector {.*"app.kubernetes.io/component":"servers".*} matches no pod template'
reject_fixture target-port refs "" \
  "Service/harrier-server: port grpc targetPort \"grcp\" is no container port of Job/harrier-server"
reject_fixture missing-volume refs "" \
  "JobSet/harrier replicatedJob worker container worker: volumeMount checkpoint (/var/lib/harrier/checkpoints) names no volume of the pod"
reject_fixture configmap-key refs "" \
  "key HARRIER_LEARNING_RATE is no flag of harrier-server or harrier-worker (no --learning_rate)"
reject_fixture bad-argument refs "" \
  "JobSet/harrier replicatedJob worker container worker args: --epoch is no flag of harrier-worker"
reject_fixture ctl-argument refs "" \
  "readinessProbe: --timeout is no flag of harrier-ctl" \
  "readinessProbe: 'healthz' is no harrier-ctl command"
# Pod Security: IPC_LOCK (what gpu-rdma once added) fails baseline.
reject_fixture ipc-lock pss "" \
  "JobSet/harrier replicatedJob server: Pod Security baseline: container server: adds capability IPC_LOCK"
reject_fixture ipc-lock policy "" \
  "replicatedJob server server: adds capability IPC_LOCK"

# reject_edit NAME RENDERED OVERLAY SED_SCRIPT PATTERN...: the rendered
# overlay edited by SED_SCRIPT must fail the policy check (the refs check
# with reject_edit_refs), naming every PATTERN.
reject_edit() { edit_check=policy reject_edit_by "$@"; }
reject_edit_refs() { edit_check=refs reject_edit_by "$@"; }
reject_edit_by() {
  local name="$1" rendered="$2" ov="$3" script="$4"
  shift 4
  sed "${script}" "${tmp}/${rendered}.yaml" > "${tmp}/policy-bad.yaml"
  if cmp -s "${tmp}/${rendered}.yaml" "${tmp}/policy-bad.yaml"; then
    echo "the edit '${script}' changed nothing in ${rendered}" > "${tmp}/why"
    report 1 "${name}" "${tmp}/why"
    return
  fi
  check --check="${edit_check}" --overlay="${ov}" "${tmp}/policy-bad.yaml" > "${tmp}/out" 2>&1
  expect_reject "${name}" "${tmp}/out" $? "$@"
}

# Counts changed by hand, not via HARRIER_NUM_SHARDS.
reject_edit "reject server replicas that disagree with HARRIER_NUM_SHARDS" overlays_cpu cpu \
  's/^    replicas: 2$/    replicas: 3/' "replicatedJob server: replicas 3 != HARRIER_NUM_SHARDS 2"
# Secrets: every pod reads its certificates and token from the Secrets,
# readable through fsGroup only, and the probes avoid the TLS port.
reject_edit "reject pods without fsGroup for the 0440 Secrets" overlays_cpu cpu '/^ *fsGroup: 65532$/d' \
  "JobSet/harrier replicatedJob worker: pod must set fsGroup" "JobSet/harrier replicatedJob server: pod must set fsGroup"
reject_edit "reject world-readable token and key files" overlays_cpu cpu \
  's/^\( *\)defaultMode: 288$/\1defaultMode: 292/' \
  "/etc/harrier/secrets/token must not be readable by others (mode 0444)"
reject_edit "reject probes on the TLS port" overlays_cpu cpu 's/--servers=127.0.0.1:8081$/--servers=127.0.0.1:50051/' \
  "server readinessProbe probes 127.0.0.1:50051, not the health port 127.0.0.1:8081"
reject_edit "reject a job without the token" overlays_cpu cpu '/^  HARRIER_AUTH_TOKEN_FILE:/d' \
  "HARRIER_AUTH_TOKEN_FILE not set in harrier-config"
# The run ends with its workers.
reject_edit "reject shards that never end (--exit_when_done=false)" overlays_cpu cpu \
  's/--exit_when_done=true/--exit_when_done=false/' "server runs --exit_when_done=false: the shards would never end"
reject_edit "reject a worker server list that misses the shard pods' names" overlays_cpu cpu \
  's/value: -0.harrier:50051$/value: .harrier:50051/' "shard names harrier-server-<i>.harrier:50051 are not the server pods' harrier-server-<i>-0.harrier:50051"
reject_edit "reject a PodDisruptionBudget that blocks drains" overlays_no-jobset no-jobset \
  's/^  maxUnavailable: 1$/  maxUnavailable: 0/' "PodDisruptionBudget/harrier-server: maxUnavailable 0 blocks node drains"
# What the overlays promise.
reject_edit "reject gpu-rdma servers without --ucx" overlays_gpu-rdma gpu-rdma '/^ *- --ucx$/d' \
  "gpu-rdma: servers must run with --ucx"
reject_edit "reject gpu workers on the CPU image" overlays_gpu gpu 's/image: harrier:dev-cuda$/image: harrier:dev/' \
  "gpu: worker must run the CUDA image"
reject_edit "reject gpu-rdma without the memlock error" overlays_gpu-rdma gpu-rdma 's/value: error$/value: warn/' \
  "gpu-rdma: server needs MEMLOCK_CHECK=error" "gpu-rdma: worker needs MEMLOCK_CHECK=error"
# Your own command as the workers.
reject_edit "reject own-command workers back on worker.sh" overlays_own-command own-command \
  's|- /opt/harrier/run.sh$|- /opt/harrier/worker.sh|' "own-command: worker must run /opt/harrier/run.sh with your command"
reject_edit "reject run.sh without a command" overlays_own-command own-command \
  '/^ *- python3$/,/^ *- "3"$/d' "JobSet/harrier replicatedJob worker: /opt/harrier/run.sh needs a command to run"
reject_edit "reject run.sh given harrier-worker flags" overlays_own-command own-command \
  's|^\( *\)- python3$|\1- --device=cpu|' "/opt/harrier/run.sh runs a command, not harrier-worker flags (args start with --device=cpu)"
reject_edit "reject own-command workers on Harrier's image" overlays_own-command own-command \
  's|image: registry.example.com/trainer:1.0$|image: harrier:dev|' "own-command: worker must run your image, not Harrier's (harrier:dev)"
reject_edit_refs "reject an entrypoint harrier-scripts lacks" overlays_own-command own-command \
  's|- /opt/harrier/run.sh$|- /opt/harrier/train.sh|' \
  "JobSet/harrier replicatedJob worker container worker: runs /opt/harrier/train.sh, which ConfigMap harrier-scripts-[a-z0-9]* does not have"

# deploy/k8s/make-secrets.sh: valid Secrets, a certificate every shard
# name of both forms matches, signed by the CA it ships.
secrets="${tmp}/secrets"
cert_matches() {
  openssl x509 -in "${secrets}/tls.crt" -noout -checkhost "$1" 2>&1 | grep -q " does match"
}
if "${k8s}/make-secrets.sh" --shards 8 --dir "${secrets}" --namespace demo --san localhost \
     > "${tmp}/secrets.yaml" 2> "${tmp}/err" &&
   check --check=schema "${tmp}/secrets.yaml" >> "${tmp}/err" 2>&1 &&
   check --check=types "${tmp}/secrets.yaml" >> "${tmp}/err" 2>&1 &&
   grep -q '^  name: harrier-tls$' "${tmp}/secrets.yaml" &&
   grep -q '^  name: harrier-token$' "${tmp}/secrets.yaml" &&
   openssl verify -CAfile "${secrets}/ca.crt" "${secrets}/tls.crt" >> "${tmp}/err" 2>&1 &&
   cert_matches harrier-server-0-0.harrier >> "${tmp}/err" &&
   cert_matches harrier-server-7-0.harrier >> "${tmp}/err" &&
   cert_matches harrier-server-1-0.harrier.demo.svc.cluster.local >> "${tmp}/err" &&
   cert_matches harrier-server-0.harrier-server >> "${tmp}/err" &&
   cert_matches harrier-server-7.harrier-server >> "${tmp}/err" &&
   cert_matches harrier-server-1.harrier-server.demo.svc.cluster.local >> "${tmp}/err" &&
   ! cert_matches harrier-server-8-0.harrier >> "${tmp}/err" &&
   ! cert_matches harrier-server-8.harrier-server >> "${tmp}/err" &&
   ! cert_matches harrier-server-0.evil >> "${tmp}/err"; then
  report 0 "make-secrets.sh: Secrets valid, certificate matches every shard name"
else
  report 1 "make-secrets.sh: Secrets valid, certificate matches every shard name" "${tmp}/err"
fi

# run.sh (components/own-command) in a shell, with the environment the
# rendered own-command worker pod gets (harrier-config's keys, the
# container's env, JOB_COMPLETION_INDEX): it must export the job as
# harrier-launch does (HARRIER_SERVERS naming the server pods, shard 0
# first; HARRIER_RANK; HARRIER_LOCAL_RANK 0 of 1; the ConfigMap's counts and
# TLS paths) and exec the command in its own place (same pid); without a
# command or a rank it stops with exit 2 before running anything.
scripts="${k8s}/base/scripts"
run_sh="fake pod: run.sh with the rendered own-command worker's environment"
if [ ! -s "${tmp}/overlays_own-command.yaml" ]; then
  echo "overlays/own-command did not render" > "${tmp}/err"
  report 1 "${run_sh}" "${tmp}/err"
else
  (
    mapfile -t pod_env < <(node -e '
      const YAML = require(process.argv[1]);
      const docs = YAML.parseAllDocuments(require("fs").readFileSync(process.argv[2], "utf8")).map((d) => d.toJS());
      const cm = docs.find((d) => d && d.kind === "ConfigMap" && /^harrier-config/.test(d.metadata.name));
      const js = docs.find((d) => d && d.kind === "JobSet");
      const c = js.spec.replicatedJobs.find((r) => r.name === "worker").template.spec.template.spec.containers[0];
      if (c.command.join(" ") !== "/bin/sh /opt/harrier/run.sh") throw new Error(`worker command is ${c.command.join(" ")}`);
      for (const [k, v] of Object.entries(cm.data)) console.log(`${k}=${v}`);
      for (const e of c.env || []) if (e.value !== undefined) console.log(`${e.name}=${e.value}`);' \
      "${here}/node_modules/yaml" "${tmp}/overlays_own-command.yaml")
    [ "${#pod_env[@]}" -gt 4 ] || { echo "no environment from the rendered overlay"; exit 1; }
    show='printf "%s\n" "servers=$HARRIER_SERVERS" "rank=$HARRIER_RANK" "local=$HARRIER_LOCAL_RANK/$HARRIER_LOCAL_SIZE" "workers=$HARRIER_NUM_WORKERS" "shards=$HARRIER_NUM_SHARDS" "ca=$HARRIER_TLS_CA" "token=$HARRIER_AUTH_TOKEN_FILE" "pid=$$"'
    env -i PATH="${PATH}" "${pod_env[@]}" JOB_COMPLETION_INDEX=1 MEMLOCK_CHECK=off \
      sh "${scripts}/run.sh" sh -c "${show}" > "${tmp}/run.out" 2> "${tmp}/run.err" &
    pid=$!
    wait "${pid}" || { echo "run.sh failed (rc=$?):"; cat "${tmp}/run.err"; exit 1; }
    printf '%s\n' "servers=harrier-server-0-0.harrier:50051,harrier-server-1-0.harrier:50051" "rank=1" "local=0/1" \
      "workers=2" "shards=2" "ca=/etc/harrier/secrets/ca.crt" "token=/etc/harrier/secrets/token" "pid=${pid}" \
      > "${tmp}/run.want"
    diff "${tmp}/run.want" "${tmp}/run.out" || { echo "(want < > got; pid ${pid} is run.sh's: it must exec the command)"; exit 1; }
    out="$(env -i PATH="${PATH}" "${pod_env[@]}" JOB_COMPLETION_INDEX=1 MEMLOCK_CHECK=off sh "${scripts}/run.sh" 2>&1)"
    rc=$?
    [ "${rc}" -eq 2 ] && [ "${out}" = "run.sh: error: no command to run: give it as the container's args, e.g. [python3, /app/train.py]" ] ||
      { echo "without a command: rc=${rc}, output: ${out}"; exit 1; }
    out="$(env -i PATH="${PATH}" "${pod_env[@]}" MEMLOCK_CHECK=off sh "${scripts}/run.sh" sh -c 'echo ran' 2>&1)"
    rc=$?
    [ "${rc}" -eq 2 ] && [ "${out}" = "run.sh: error: JOB_COMPLETION_INDEX='' is not a rank (not an Indexed Job?)" ] ||
      { echo "without JOB_COMPLETION_INDEX: rc=${rc}, output: ${out}"; exit 1; }
  ) > "${tmp}/err" 2>&1
  report $? "${run_sh}: HARRIER_SERVERS, HARRIER_RANK, HARRIER_LOCAL_* exported, the command exec'd; no command or rank: exit 2" "${tmp}/err"
fi

server_bin="${bin_dir}/server/harrier-server"
worker_bin="${bin_dir}/worker/harrier-worker"
have_bins=1
if [ ! -x "${server_bin}" ] || [ ! -x "${worker_bin}" ]; then
  have_bins=0
  echo "not built: bazel build //server:harrier-server //worker:harrier-worker (or pass --bin_dir)" > "${tmp}/nobin"
fi
data_dir=/usr/share/datasets/fashion-mnist

# wait_for FILE SECONDS: until FILE is non-empty.
wait_for() {
  local i
  for i in $(seq 1 $(($2 * 10))); do [ -s "$1" ] && return 0; sleep 0.1; done
  return 1
}

# The entrypoints (base/scripts) with the real binaries, environment as
# the pods set it (no TLS: the certificate names no 127.0.0.1): a shard
# started by server.sh, a worker by worker.sh that builds its server list
# from SERVER_PREFIX<i>SERVER_SUFFIX (the shard's port is chosen to end
# in "00" so that the list is 127.0.0.1:<Q>00 for shard 0). Then: the
# servers' readiness probe (harrier-ctl health) passes against it; the
# shard ends by itself once the worker is done (--exit_when_done); a pod
# with the same RUN_ID resumes (--resume on the command line), a new
# RUN_ID starts fresh; a small memlock limit warns, or stops with
# MEMLOCK_CHECK=error.
live="live: entrypoints with the real binaries:"
if [ "${have_bins}" -eq 0 ]; then
  report 1 "${live} server.sh/worker.sh" "${tmp}/nobin"
elif [ ! -d "${data_dir}" ]; then
  echo "SKIP ${live} server.sh/worker.sh (dataset-fashion-mnist not installed)"
else
  ckpt="${tmp}/ckpt"
  mkdir -p "${ckpt}"
  # start_shard RUN_ID LOG: server.sh in the background (exec: same pid).
  start_shard() {
    q=$((RANDOM % 400 + 200))
    env -i PATH="${PATH}" SHARD_INDEX=0 RUN_ID="$1" HARRIER_CHECKPOINT_DIR="${ckpt}" \
      HARRIER_NUM_SHARDS=1 HARRIER_NUM_WORKERS=1 MEMLOCK_CHECK=off BIN_DIR="${bin_dir}/server" \
      sh "${scripts}/server.sh" --host=127.0.0.1 --port="${q}00" --metrics_port=0 --health_port=0 \
      > "$2" 2>&1 &
    shard_pid=$!
    pids+=("${shard_pid}")
  }
  cmdline() { tr '\0' ' ' < "/proc/$1/cmdline" 2>/dev/null; }
  # The shard runs on (in the background) into the next check.
  start_shard run-a "${tmp}/shard1.log"
  # Before the worker runs: the shard ends with its job, so afterwards
  # nothing would answer the probe.
  # The server pods' readiness probe, word for word from the rendered base
  # (its port moved to this shard's --health_port), passes against it.
  probe_name="${live} the servers' readiness probe (harrier-ctl health) passes against the shard"
  ctl_bin="${bin_dir}/server/harrier-ctl"
  if [ ! -x "${ctl_bin}" ]; then
    echo "harrier-ctl not built (${ctl_bin}; bazel build //server:harrier-ctl)" > "${tmp}/err"
    report 1 "${probe_name}: harrier-ctl not built" "${tmp}/err"
  else
    (
      health=""
      for _ in $(seq 1 100); do
        health="$(sed -n 's/.* health_port=\([0-9][0-9]*\).*/\1/p' "${tmp}/shard1.log" | head -n 1)"
        [ -n "${health}" ] && break
        sleep 0.1
      done
      [ -n "${health}" ] || { echo "no health_port in the shard's log:"; cat "${tmp}/shard1.log"; exit 1; }
      mapfile -t probe < <(node -e '
        const YAML = require(process.argv[1]);
        const docs = YAML.parseAllDocuments(require("fs").readFileSync(process.argv[2], "utf8")).map((d) => d.toJS());
        const js = docs.find((d) => d && d.kind === "JobSet");
        const c = js.spec.replicatedJobs.find((r) => r.name === "server").template.spec.template.spec.containers[0];
        for (const w of c.readinessProbe.exec.command) console.log(w);' "${here}/node_modules/yaml" "${tmp}/base.yaml")
      [ "${#probe[@]}" -gt 1 ] || { echo "no readiness probe command in the rendered base"; exit 1; }
      probe[0]="${ctl_bin}"
      probe=("${probe[@]/#--servers=127.0.0.1:8081/--servers=127.0.0.1:${health}}")
      timeout 10 "${probe[@]}" || { echo "probe failed (rc=$?): ${probe[*]}"; exit 1; }
      # And it fails where nothing serves.
      if timeout 10 "${probe[@]/#--servers=*/--servers=127.0.0.1:9}" > /dev/null 2>&1; then
        echo "the probe passed against a closed port"; exit 1
      fi
    ) > "${tmp}/err" 2>&1
    report $? "${probe_name}" "${tmp}/err"
  fi
  (
    sleep 0.5
    case "$(cmdline "${shard_pid}")" in
      *harrier-server*) ;;
      *) echo "server.sh did not exec harrier-server:"; cat "${tmp}/shard1.log"; exit 1 ;;
    esac
    case "$(cmdline "${shard_pid}")" in *--resume*) echo "a first start resumed: $(cmdline "${shard_pid}")"; exit 1 ;; esac
    [ "$(cat "${ckpt}/.harrier-run-id" 2>/dev/null)" = run-a ] || { echo "server.sh did not record RUN_ID run-a"; exit 1; }
    env -i PATH="${PATH}" JOB_COMPLETION_INDEX=0 HARRIER_NUM_SHARDS=1 SERVER_PREFIX="127.0.0.1:${q}" \
      SERVER_SUFFIX=0 HARRIER_DATA_DIR="${data_dir}" MEMLOCK_CHECK=off BIN_DIR="${bin_dir}/worker" \
      timeout 90 sh "${scripts}/worker.sh" --max_steps=20 --train_examples=1024 --log_every=10 \
      --metrics_port=-1 --connect_timeout_s=20 > "${tmp}/worker1.log" 2>&1 ||
      { echo "worker.sh failed:"; tail -n 20 "${tmp}/worker1.log"; exit 1; }
    grep -q '^test_accuracy=' "${tmp}/worker1.log" || { echo "no test_accuracy= line"; tail -n 20 "${tmp}/worker1.log"; exit 1; }
  ) > "${tmp}/err" 2>&1
  report $? "${live} worker.sh builds the server list and trains against a shard started by server.sh" "${tmp}/err"
  # The shard ends with its only worker: exit 0 within 30 s.
  (
    for _ in $(seq 1 300); do kill -0 "${shard_pid}" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "${shard_pid}" 2>/dev/null; then
      echo "the shard still runs 30 s after its only worker finished (harrier-server --exit_when_done):"
      tail -n 3 "${tmp}/shard1.log"; exit 1
    fi
  ) > "${tmp}/err" 2>&1
  ended=$?
  if [ "${ended}" -eq 0 ]; then
    wait "${shard_pid}"; rc=$?
    [ "${rc}" -eq 0 ] || { echo "the shard exited ${rc}, not 0:"; tail -n 5 "${tmp}/shard1.log"; } > "${tmp}/err" 2>&1
    [ "${rc}" -eq 0 ]; ended=$?
  else
    kill "${shard_pid}" 2>/dev/null; wait "${shard_pid}" 2>/dev/null
  fi
  report "${ended}" "${live} the shard exits 0 once its worker finished (the run ends)" "${tmp}/err"
  # Same RUN_ID: a retry of this run, which resumes it; a new RUN_ID is
  # a fresh run.
  (
    start_shard run-a "${tmp}/shard2.log"
    sleep 0.5
    got="$(cmdline "${shard_pid}")"
    kill "${shard_pid}" 2>/dev/null; wait "${shard_pid}" 2>/dev/null
    case "${got}" in
      *harrier-server*--resume*) ;;
      *) echo "a retry with the same RUN_ID did not pass --resume: ${got}"; cat "${tmp}/shard2.log"; exit 1 ;;
    esac
    start_shard run-b "${tmp}/shard3.log"
    sleep 0.5
    got="$(cmdline "${shard_pid}")"
    kill "${shard_pid}" 2>/dev/null; wait "${shard_pid}" 2>/dev/null
    case "${got}" in
      *harrier-server*--resume*) echo "a new RUN_ID resumed: ${got}"; exit 1 ;;
      *harrier-server*) ;;
      *) echo "server.sh did not exec harrier-server:"; cat "${tmp}/shard3.log"; exit 1 ;;
    esac
  ) > "${tmp}/err" 2>&1
  report $? "${live} server.sh passes --resume for the same RUN_ID only" "${tmp}/err"
  # memlock: 64 KiB warns by default and stops with MEMLOCK_CHECK=error.
  (
    small() { (ulimit -l 64 && env -i PATH="${PATH}" SHARD_INDEX=0 MEMLOCK_CHECK="$1" \
      BIN_DIR="${bin_dir}/server" sh "${scripts}/server.sh" --help); }
    out="$(small error 2>&1)"; rc=$?
    [ "${rc}" -eq 2 ] && printf '%s' "${out}" | grep -q "error: locked-memory limit is 64 KiB" ||
      { echo "MEMLOCK_CHECK=error with 64 KiB: rc=${rc}, output: ${out}"; exit 1; }
    out="$(small warn 2>&1)"
    printf '%s' "${out}" | grep -q "warning: locked-memory limit is 64 KiB" &&
      printf '%s' "${out}" | grep -q "^Usage: harrier-server" ||
      { echo "MEMLOCK_CHECK=warn with 64 KiB did not warn and start: ${out}" | head -n 5; exit 1; }
  ) > "${tmp}/err" 2>&1
  report $? "${live} a small memlock limit warns, or stops with MEMLOCK_CHECK=error" "${tmp}/err"
  # run.sh with the real harrier-worker as the command, configured by the
  # environment run.sh exports (no --servers, no --rank), against a shard
  # started by server.sh: the job it describes is one Harrier runs.
  (
    start_shard run-c "${tmp}/shard4.log"
    env -i PATH="${PATH}" JOB_COMPLETION_INDEX=0 HARRIER_NUM_SHARDS=1 HARRIER_NUM_WORKERS=1 \
      SERVER_PREFIX="127.0.0.1:${q}" SERVER_SUFFIX=0 HARRIER_DATA_DIR="${data_dir}" MEMLOCK_CHECK=off \
      timeout 90 sh "${scripts}/run.sh" "${bin_dir}/worker/harrier-worker" --max_steps=20 --train_examples=1024 \
      --log_every=10 --metrics_port=-1 --connect_timeout_s=20 > "${tmp}/worker2.log" 2>&1
    rc=$?
    for _ in $(seq 1 300); do kill -0 "${shard_pid}" 2>/dev/null || break; sleep 0.1; done
    kill "${shard_pid}" 2>/dev/null; wait "${shard_pid}" 2>/dev/null
    [ "${rc}" -eq 0 ] || { echo "run.sh harrier-worker failed (rc=${rc}):"; tail -n 20 "${tmp}/worker2.log"; exit 1; }
    grep -q '^test_accuracy=' "${tmp}/worker2.log" || { echo "no test_accuracy= line"; tail -n 20 "${tmp}/worker2.log"; exit 1; }
    grep -q "worker_done shard=0 rank=0" "${tmp}/shard4.log" || { echo "the shard saw no rank 0 finish:"; tail -n 5 "${tmp}/shard4.log"; exit 1; }
  ) > "${tmp}/err" 2>&1
  report $? "${live} run.sh runs harrier-worker, configured by HARRIER_SERVERS and HARRIER_RANK alone, against a shard started by server.sh" "${tmp}/err"
fi

# The same files with the real binaries, configured the way the pods are:
# the harrier.env variables (paths moved to the files made above, mode
# 0440 like the mount), mutual TLS and the token. A worker trains 20 steps;
# one without a client certificate is refused.
live="live: server and worker with make-secrets.sh's files and harrier.env's TLS/token settings"
if [ "${have_bins}" -eq 0 ]; then
  report 1 "${live}" "${tmp}/nobin"
elif [ ! -d /usr/share/datasets/fashion-mnist ]; then
  echo "SKIP ${live} (dataset-fashion-mnist not installed)"
else
  chmod 0440 "${secrets}"/*
  env_for_pod() {  # the harrier.env TLS/token lines, paths moved to ${secrets}
    grep -E '^HARRIER_(TLS_CERT|TLS_KEY|TLS_CA|AUTH_TOKEN_FILE)=' "${k8s}/base/harrier.env" |
      sed "s|=/etc/harrier/secrets/|=${secrets}/|"
  }
  mapfile -t pod_env < <(env_for_pod)
  rm -f "${tmp}/port"
  env "${pod_env[@]}" timeout 120 "${server_bin}" --host=127.0.0.1 --port=0 \
    --port_file="${tmp}/port" --num_workers=1 --health_port=0 > "${tmp}/server.log" 2>&1 &
  server_pid=$!
  for _ in $(seq 1 100); do [ -s "${tmp}/port" ] && break; sleep 0.1; done
  port="$(cat "${tmp}/port" 2>/dev/null || true)"
  worker=(timeout 90 "${worker_bin}" --servers="localhost:${port}" --max_steps=20
          --train_examples=2048 --log_every=10 --connect_timeout_s=10 --rpc_timeout_s=30)
  ok=1
  (
    [ -n "${port}" ] || { echo "server did not start"; cat "${tmp}/server.log"; exit 1; }
    grep -q "tls=mutual token=on" "${tmp}/server.log" || { echo "server not on mutual TLS + token:"; cat "${tmp}/server.log"; exit 1; }
    no_cert=()
    for e in "${pod_env[@]}"; do case "$e" in HARRIER_TLS_CERT=*|HARRIER_TLS_KEY=*) ;; *) no_cert+=("$e") ;; esac; done
    if env "${no_cert[@]}" "${worker[@]}" --connect_timeout_s=3 > "${tmp}/refused.log" 2>&1; then
      echo "a worker without a client certificate was let in"; exit 1
    fi
    env "${pod_env[@]}" "${worker[@]}" > "${tmp}/worker.log" 2>&1 ||
      { echo "worker failed:"; tail -n 20 "${tmp}/worker.log"; exit 1; }
    grep -q '^test_accuracy=' "${tmp}/worker.log" || { echo "no test_accuracy= line"; tail -n 20 "${tmp}/worker.log"; exit 1; }
  ) > "${tmp}/err" 2>&1 && ok=0
  kill "${server_pid}" 2>/dev/null; wait "${server_pid}" 2>/dev/null
  report "${ok}" "${live}" "${tmp}/err"
fi

# yamllint must reject the lint fixture (duplicate key, bare yes).
yamllint -s -c "${here}/yamllint.yaml" "${here}/fixtures/yamllint-bad.yaml" > "${tmp}/out" 2>&1
expect_reject "reject fixtures/yamllint-bad.yaml by yamllint" "${tmp}/out" $? \
  "key-duplicates" "truthy"

finish
