#!/usr/bin/env bash
# Installs Harrier's C++ client library for builds without Bazel:
#   bazel run //:install                  # under /usr/local
#   bazel run //:install -- --prefix=DIR  # under DIR
# Writes DIR/lib/libharrier.so.0 (and the libharrier.so link),
# DIR/include/harrier/{worker/client.h, worker/operation_handle.h, common/...} (-IDIR/include/harrier,
# so programs include "worker/client.h" as in the repository),
# DIR/lib/pkgconfig/harrier.pc and DIR/lib/cmake/harrier/harrierConfig.cmake
# (imported target harrier::harrier). Abseil, gRPC, protobuf, UCX and spdlog
# stay Debian's system libraries (deploy/setup.sh installs them).
set -euo pipefail
version=0.1.0
prefix=/usr/local
for arg in "$@"; do
  case "$arg" in
    --prefix=*) prefix=${arg#*=} ;;
    -h|--help) sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install: unknown option $arg (see --help)" >&2; exit 2 ;;
  esac
done
[ -n "$prefix" ] || { echo "install: --prefix= needs a directory" >&2; exit 2; }
# `bazel run` starts this in its runfiles tree: a relative prefix means the
# directory the command was typed in.
case "$prefix" in
  /*) ;;
  *) prefix="${BUILD_WORKING_DIRECTORY:-$PWD}/$prefix" ;;
esac

runfiles=""
for candidate in "${RUNFILES_DIR:-$0.runfiles}/harrier" "$(dirname "$0")"; do
  [ -f "$candidate/worker/libharrier.so" ] && { runfiles=$candidate; break; }
done
[ -n "$runfiles" ] || {
  echo "install: the built library is missing (bazel build //worker:libharrier.so)" >&2; exit 1
}

mkdir -p "$prefix/lib/pkgconfig" "$prefix/lib/cmake/harrier" "$prefix/include/harrier/worker"
# cp, not install(1): in a test's runfiles, `install` is this script.
cp -f "$runfiles/worker/libharrier.so" "$prefix/lib/libharrier.so.0"
chmod 0755 "$prefix/lib/libharrier.so.0"
ln -sfn libharrier.so.0 "$prefix/lib/libharrier.so"
# The headers are //worker:client_headers, the one list of them: client.h
# and what it includes, at their repository paths.
for header in worker/client.h worker/operation_handle.h common/payload_view.h \
              common/codec/codec.h common/codec/codec_backend.h; do
  [ -f "$runfiles/$header" ] || { echo "install: $header is missing from the build" >&2; exit 1; }
  mkdir -p "$prefix/include/harrier/$(dirname "$header")"
  cp -f "$runfiles/$header" "$prefix/include/harrier/$header"
  chmod 0644 "$prefix/include/harrier/$header"
done

# Requires: what the installed headers include (Abseil). gRPC, protobuf,
# UCX and spdlog are libharrier.so's own business: its DT_NEEDED entries name
# them for the dynamic linker, and there is no static libharrier for
# Requires.private to serve. The rpath lets a program run from a prefix
# outside the loader's search path without LD_LIBRARY_PATH.
cat >"$prefix/lib/pkgconfig/harrier.pc" <<PC
prefix=$prefix
libdir=\${prefix}/lib
includedir=\${prefix}/include/harrier

Name: harrier
Description: Harrier parameter server client library
Version: $version
Requires: absl_status absl_statusor absl_time absl_strings absl_span
Cflags: -I\${includedir}
Libs: -L\${libdir} -Wl,-rpath,\${libdir} -lharrier
PC

# Relocatable: paths from the file's own location. CMake puts the library's
# directory in the build tree's rpath by itself.
cat >"$prefix/lib/cmake/harrier/harrierConfig.cmake" <<'CMAKE'
# harrier::harrier: the Harrier client library (include "worker/client.h").
include(CMakeFindDependencyMacro)
find_dependency(absl CONFIG)
get_filename_component(_harrier_prefix "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
if(NOT TARGET harrier::harrier)
  add_library(harrier::harrier SHARED IMPORTED)
  set_target_properties(harrier::harrier PROPERTIES
    IMPORTED_LOCATION "${_harrier_prefix}/lib/libharrier.so.0"
    IMPORTED_SONAME "libharrier.so.0"
    INTERFACE_INCLUDE_DIRECTORIES "${_harrier_prefix}/include/harrier"
    INTERFACE_COMPILE_FEATURES cxx_std_17
    INTERFACE_LINK_LIBRARIES "absl::status;absl::statusor;absl::time;absl::strings;absl::span")
endif()
unset(_harrier_prefix)
CMAKE
cat >"$prefix/lib/cmake/harrier/harrierConfigVersion.cmake" <<CMAKE
set(PACKAGE_VERSION "$version")
if(PACKAGE_FIND_VERSION VERSION_GREATER PACKAGE_VERSION OR
   NOT PACKAGE_FIND_VERSION_MAJOR EQUAL "${version%%.*}")
  set(PACKAGE_VERSION_COMPATIBLE FALSE)
else()
  set(PACKAGE_VERSION_COMPATIBLE TRUE)
  if(PACKAGE_FIND_VERSION VERSION_EQUAL PACKAGE_VERSION)
    set(PACKAGE_VERSION_EXACT TRUE)
  endif()
endif()
CMAKE
chmod -R u+w "$prefix/include/harrier" "$prefix/lib/cmake/harrier" "$prefix/lib/pkgconfig/harrier.pc"
echo "install: harrier $version installed under $prefix" \
  "(pkg-config: PKG_CONFIG_PATH=$prefix/lib/pkgconfig; CMake: CMAKE_PREFIX_PATH=$prefix)" >&2
