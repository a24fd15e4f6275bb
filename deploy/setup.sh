#!/usr/bin/env bash
# Installs every Debian package Harrier needs to build, test and run.
# Idempotent; prints nothing when everything is already present.
set -euo pipefail

# gnuplot-nox: docs/results/ figures (bench/scripts/convergence_report.py
# and its tests).
# wordnet-base: the glosses of examples/wordnet_text.py (sparse tables).
PACKAGES=(
  bazel-bootstrap build-essential pkg-config cmake
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libucx-dev ucx-utils libabsl-dev libspdlog-dev libfmt-dev catch2 zlib1g-dev
  nlohmann-json3-dev libisal-dev
  libopenblas-dev dataset-fashion-mnist prometheus-cpp-dev
  clang-14 libclang-rt-14-dev libfuzzer-14-dev
  libgloo-dev iproute2 openssh-server openssh-client
  python3-dev pybind11-dev python3-numpy python3-torch
  yamllint nodejs npm kubectl
  gnuplot-nox wordnet-base
)

missing=()
for package in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$package")
  fi
done

# kubectl is not in Debian 12's archive; machines that have it installed it
# from elsewhere. Only ask apt for what apt can give.
want=()
for package in "${missing[@]}"; do
  if [ "$package" = kubectl ] && command -v kubectl >/dev/null 2>&1; then continue; fi
  if [ "$package" = nodejs ] && command -v node >/dev/null 2>&1; then continue; fi
  if [ "$package" = npm ] && command -v npm >/dev/null 2>&1; then continue; fi
  want+=("$package")
done

if ((${#want[@]})); then
  echo "setup: installing ${want[*]}" >&2
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO=sudo
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  available=()
  for package in "${want[@]}"; do
    if apt-cache show "$package" >/dev/null 2>&1; then
      available+=("$package")
    else
      echo "setup: package $package is not in the archive; skipping (its checks will say so)" >&2
    fi
  done
  if ((${#available[@]})); then
    $SUDO apt-get install -y -qq --no-install-recommends "${available[@]}" >/dev/null
  fi
fi
