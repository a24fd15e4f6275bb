#!/usr/bin/env bash
# Installs what tests/k8s/validate.sh needs: the pinned npm packages (from
# package-lock.json, with `npm ci`, into tests/k8s/node_modules) and yamllint
# (Debian package). Idempotent: quiet and quick when all is in place.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "${here}"

need() { command -v "$1" >/dev/null 2>&1; }

# yamllint from Debian.
if ! need yamllint; then
  echo "install.sh: installing yamllint (apt-get)"
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi
  ${sudo} apt-get install -y -qq yamllint >/dev/null 2>&1 \
    || { ${sudo} apt-get update -qq >/dev/null && ${sudo} apt-get install -y -qq yamllint >/dev/null; }
fi

for tool in node npm kubectl; do
  if ! need "${tool}"; then
    echo "install.sh: ${tool} not found; install it (kubectl >= 1.27 with built-in kustomize, Node.js >= 18)" >&2
    exit 1
  fi
done

# npm packages, pinned by package-lock.json. The stamp records which lock
# file node_modules was installed from.
stamp="node_modules/.harrier-install-stamp"
want="$(sha256sum package-lock.json | cut -d' ' -f1)"
if [ -f "${stamp}" ] && [ "$(cat "${stamp}")" = "${want}" ]; then
  exit 0
fi
echo "install.sh: npm ci (tests/k8s/node_modules)"
npm ci --no-audit --no-fund --loglevel=error >/dev/null
echo "${want}" > "${stamp}"
echo "install.sh: done"
