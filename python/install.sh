#!/usr/bin/env bash
# Installs the built harrier package for Debian's /usr/bin/python3:
#   bazel run //python:install                 # /usr/local/lib/python3.X/dist-packages
#   bazel run //python:install -- --prefix=DIR # DIR/harrier (then PYTHONPATH=DIR)
set -euo pipefail
prefix=""
for arg in "$@"; do
  case "$arg" in
    --prefix=*) prefix=${arg#*=} ;;
    -h|--help) sed -n '2,4p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install: unknown option $arg (see --help)" >&2; exit 2 ;;
  esac
done
if [ -z "$prefix" ]; then
  prefix=$(/usr/bin/python3 -c 'import sys; print("/usr/local/lib/python%d.%d/dist-packages" % sys.version_info[:2])')
fi
package=""
for candidate in "${RUNFILES_DIR:-$0.runfiles}/harrier/python/pkg/harrier" "$(dirname "$0")/pkg/harrier"; do
  [ -f "$candidate/_harrier.so" ] && { package=$candidate; break; }
done
[ -n "$package" ] || { echo "install: the built package is missing (bazel build //python:package)" >&2; exit 1; }
mkdir -p "$prefix/harrier"
cp -f "$package"/__init__.py "$package"/sparse_rows.py "$package"/torch.py "$package"/_harrier.so \
  "$prefix/harrier/"
chmod -R u+w "$prefix/harrier"
echo "install: harrier installed in $prefix/harrier; try: /usr/bin/python3 -c 'import harrier'" >&2
