#!/usr/bin/env bash
# Offline validation of Harrier's Kubernetes manifests (deploy/k8s).
# Run tests/k8s/install.sh once first. Prints one line per check,
#   PASS <check>   or   FAIL <check>   (followed by the details, indented),
# then "N passed, M failed"; exits 1 if any check failed.
#
# Checks: yamllint on the sources; for the base and every overlay: render
# with kubectl kustomize, schema (kubernetes-models JSON schemas: types,
# required fields, enums), types (TypeScript check against the
# kubernetes-models interfaces: also rejects unknown fields), policy
# (Harrier's rules, and what each overlay promises); scaling through the
# ConfigMap; and that deliberately broken fixtures are rejected.
set -u

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "${here}/../.." && pwd)"
k8s="${root}/deploy/k8s"
tmp="$(mktemp -d)"
trap 'rm -rf "${tmp}"' EXIT

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

check() { node "${here}/check.js" "$@"; }

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

# Lint the sources (the broken fixture too: it is broken in content only).
yamllint -s -c "${here}/yamllint.yaml" "${k8s}" "${here}/fixtures/broken" "${here}/fixtures/scaled" \
  "${here}/yamllint.yaml" > "${tmp}/lint" 2>&1
report $? "yamllint deploy/k8s" "${tmp}/lint"

# Render and validate the base and every overlay.
for target in base overlays/cpu overlays/gpu overlays/gpu-rdma; do
  out="${tmp}/$(echo "${target}" | tr / _).yaml"
  if ! kubectl kustomize "${k8s}/${target}" > "${out}" 2> "${tmp}/err"; then
    report 1 "render ${target}" "${tmp}/err"
    continue
  fi
  report 0 "render ${target}"
  check --check=schema "${out}" > "${tmp}/err" 2>&1
  report $? "schema ${target}" "${tmp}/err"
  check --check=types "${out}" > "${tmp}/err" 2>&1
  report $? "types ${target}" "${tmp}/err"
  overlay=""
  case "${target}" in overlays/*) overlay="--overlay=${target#overlays/}" ;; esac
  check --check=policy ${overlay} "${out}" > "${tmp}/err" 2>&1
  report $? "policy ${target}" "${tmp}/err"
done

# Scaling is one edit: the ConfigMap's counts drive replicas/completions.
if kubectl kustomize "${here}/fixtures/scaled" > "${tmp}/scale.yaml" 2> "${tmp}/err"; then
  { check --check=policy --overlay=cpu "${tmp}/scale.yaml" \
      && grep -q '^  replicas: 4$' "${tmp}/scale.yaml" \
      && grep -q '^  completions: 8$' "${tmp}/scale.yaml"; } > "${tmp}/err" 2>&1
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

# The broken fixture renders (kustomize checks no field names) but must be
# rejected: unknown field spec.replicaz, misspelled container field
# imagePullPolicyy, wrong type backoffLimit: "six".
broken="${here}/fixtures/broken"
if kubectl kustomize "${broken}" > "${tmp}/broken.yaml" 2> "${tmp}/err"; then
  check --check=schema "${tmp}/broken.yaml" > "${tmp}/out" 2>&1
  expect_reject "reject fixtures/broken by schema (wrong type)" "${tmp}/out" $? \
    "spec/backoffLimit must be integer"
  check --check=types "${tmp}/broken.yaml" > "${tmp}/out" 2>&1
  expect_reject "reject fixtures/broken by types (unknown fields, wrong type)" "${tmp}/out" $? \
    "'\"replicaz\"' does not exist in type 'IStatefulSetSpec'" \
    "'\"imagePullPolicyy\"' does not exist in type 'IContainer'" \
    "\"backoffLimit\": \"six\".*not assignable to type 'number'"
else
  report 1 "render fixtures/broken" "${tmp}/err"
fi

# Broken policy: server replicas changed by hand, not via HARRIER_NUM_SHARDS.
sed 's/^  replicas: 2$/  replicas: 3/' "${tmp}/overlays_cpu.yaml" > "${tmp}/policy-bad.yaml"
check --check=policy --overlay=cpu "${tmp}/policy-bad.yaml" > "${tmp}/out" 2>&1
expect_reject "reject replicas that disagree with HARRIER_NUM_SHARDS" "${tmp}/out" $? \
  "StatefulSet replicas 3 != HARRIER_NUM_SHARDS 2"

# yamllint must reject the lint fixture (duplicate key, bare yes).
yamllint -s -c "${here}/yamllint.yaml" "${here}/fixtures/yamllint-bad.yaml" > "${tmp}/out" 2>&1
expect_reject "reject fixtures/yamllint-bad.yaml by yamllint" "${tmp}/out" $? \
  "key-duplicates" "truthy"

finish
