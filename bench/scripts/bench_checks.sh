#!/usr/bin/env bash
# Bench checks: the speed, rate and ranking checks that need a quiet machine,
# run by hand (CI asserts only what a loaded machine keeps). One JSON line
# per check with a "verdict"; see bench_checks.py --help and
# docs/experiments.md, "Bench checks".
#
#   sudo bench/scripts/bench_checks.sh [links|overlap|advisor|attack|all ...] [--bin_dir=bazel-bin]
set -euo pipefail
python=/usr/bin/python3
[ -x "$python" ] || python=python3
exec "$python" "$(dirname "$0")/bench_checks.py" "$@"
