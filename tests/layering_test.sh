#!/usr/bin/env bash
# Layering rules of the source tree, checked on the #include lines:
#   cuda/    role-free device code: includes neither worker/ nor server/
#   common/  shared by both roles:  includes neither worker/ nor server/
#   server/  includes no worker/ header; worker/ includes no server/ header
#            (what both need lives in common/)
#   bench/   the experiments product sits on top: none of the four above
#            includes a bench/ header, and bench/ includes no tests/ header
#            (what benches and tests share lives in testing/)
#   testing/ helpers for tests and benches: includes no tests/ or bench/ header
# Prints every offending line (file:line:text) and fails if there is one;
# ends with "N checks passed, M failed", one check per rule.
#
# Usage: tests/layering_test.sh [SOURCE_ROOT]. Under `bazel test
# //tests:layering_test` the root is found by following this script's
# runfiles symlink back to the source tree. The tree is read directly rather
# than declared as data because a glob cannot cross package boundaries: a
# package added under server/ or worker/ tomorrow is checked without anyone
# remembering to list it. The price is that Bazel cannot see the inputs, so
# the target is tagged "external" (never cached).
set -uo pipefail

if [ $# -ge 1 ]; then
  root=$1
else
  root=$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)
fi
for dir in cuda common server worker bench testing; do
  if [ ! -d "$root/$dir" ]; then
    echo "layering_test: no $dir/ under $root (pass the source root as \$1)"
    echo "0 checks passed, 1 failed"
    exit 1
  fi
done

passed=0
failed=0
# rule DIR FORBIDDEN...: every #include of a FORBIDDEN/ header from a source
# file under DIR/ is a violation.
rule() {
  local dir=$1; shift
  local forbidden pattern hits names
  forbidden=$(IFS='|'; echo "$*")
  names=$(printf '%s/ or ' "$@"); names=${names% or }
  pattern="^[[:space:]]*#[[:space:]]*include[[:space:]]*[\"<]($forbidden)/"
  hits=$(cd "$root" && grep -rnE "$pattern" "$dir" \
           --include='*.h' --include='*.hh' --include='*.hpp' --include='*.cc' \
           --include='*.cpp' --include='*.cu' --include='*.cuh' --include='*.inc')
  if [ -n "$hits" ]; then
    echo "FAIL $dir/ must not include $names:"
    echo "$hits" | sed 's/^/  /'
    failed=$((failed + 1))
  else
    echo "PASS $dir/ includes no $names"
    passed=$((passed + 1))
  fi
}

rule cuda worker server bench
rule common worker server bench
rule server worker bench
rule worker server bench
rule bench tests
rule testing tests bench

echo "$passed checks passed, $failed failed"
[ "$failed" -eq 0 ]
