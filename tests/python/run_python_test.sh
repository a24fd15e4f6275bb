#!/usr/bin/env bash
# Runs one Python test (tests/python/NAME.py) with Debian's /usr/bin/python3
# against the harrier package built by //python:package.
set -euo pipefail
root="$TEST_SRCDIR/${TEST_WORKSPACE:-harrier}"
export PYTHONPATH="$root/python/pkg:$root/tests/python"
export HARRIER_SERVER="$root/server/harrier-server"
export OMP_NUM_THREADS=1
if ! /usr/bin/python3 -c "import numpy, torch" 2>/dev/null; then
  echo "FAIL: /usr/bin/python3 lacks numpy or torch (deploy/setup.sh installs python3-numpy and python3-torch)"
  echo "0 checks passed, 1 failed"
  exit 1
fi
exec timeout "${HARRIER_PY_TEST_TIMEOUT:-600}" /usr/bin/python3 -u "$root/tests/python/$1" "${@:2}"
