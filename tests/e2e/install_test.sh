#!/usr/bin/env bash
# The installed client library: `//:install` into a
# temporary prefix, then the README's program (examples/own_loop.cc) built in
# a folder outside the repository with g++ + pkg-config and with CMake from
# the README's CMakeLists.txt, each trained against a real harrier-server.
# Also checks the install's shape (closed header set, exported Client
# symbols, no run-time dependency on the Bazel tree) and that a header left
# out of the install breaks the build, so this test can fail.
set -uo pipefail
root="$TEST_SRCDIR/${TEST_WORKSPACE:-harrier}"
prefix="$TEST_TMPDIR/prefix"
work="$TEST_TMPDIR/outside"
failures=0
total=0
check() {  # name, command...: PASS if the command succeeds
  local name=$1; shift
  total=$((total + 1))
  if "$@" >"$TEST_TMPDIR/check.log" 2>&1; then
    echo "PASS $name"
  else
    echo "FAIL $name:"; tail -n 15 "$TEST_TMPDIR/check.log" | sed 's/^/  /'
    failures=$((failures + 1))
  fi
}
finish() {
  echo "$((total - failures)) checks passed, $failures failed"
  [ "$failures" -eq 0 ]
  exit
}

# --- the install ----------------------------------------------------------
check "install --prefix" "$root/install" --prefix="$prefix"
installed_files() {
  local f
  for f in lib/libharrier.so.0 lib/libharrier.so include/harrier/worker/client.h \
           lib/pkgconfig/harrier.pc lib/cmake/harrier/harrierConfig.cmake \
           lib/cmake/harrier/harrierConfigVersion.cmake; do
    [ -e "$prefix/$f" ] || { echo "missing $prefix/$f"; return 1; }
  done
  [ "$(readlink "$prefix/lib/libharrier.so")" = libharrier.so.0 ]
}
check "installed files" installed_files
[ "$failures" -eq 0 ] || finish

# Every quoted #include in an installed header is installed too (or a system
# header: Abseil's are Debian's).
headers_closed() {
  local header inc bad=0
  while IFS= read -r header; do
    while IFS= read -r inc; do
      [ -f "$prefix/include/harrier/$inc" ] || [ -f "/usr/include/$inc" ] ||
        { echo "$header includes \"$inc\", which is not installed"; bad=1; }
    done < <(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$header")
  done < <(find "$prefix/include/harrier" -name '*.h')
  return $bad
}
check "installed headers include only installed or system headers" headers_closed

exports_client() {
  local symbols symbol
  symbols=$(nm -D --defined-only -C "$prefix/lib/libharrier.so.0") || return 1
  for symbol in 'harrier::Client::Create(harrier::ClientOptions const&)' \
                'harrier::Client::~Client()' 'harrier::Client::RegisterTensor(' \
                'harrier::Client::Pull(' 'harrier::Client::Push(' 'harrier::Client::PushAsync(' \
                'harrier::Client::Wait(' 'harrier::Client::Clock()' 'harrier::Client::Leave()' \
                'harrier::Client::StartTimeline(' 'harrier::Client::StopTimeline(' \
                'harrier::OperationHandle::id() const'; do
    grep -qF "$symbol" <<<"$symbols" || { echo "libharrier.so does not export $symbol"; return 1; }
  done
}
check "libharrier.so exports the Client API" exports_client
# Everything it needs at run time comes from the system, none from the
# Bazel tree (_solib_*, execroot, runfiles).
needs_only_system() {
  local deps
  deps=$(ldd "$prefix/lib/libharrier.so.0") || return 1
  echo "$deps"
  ! grep -qE 'not found|_solib|execroot|runfiles|bazel' <<<"$deps" &&
    [ "$(readelf -d "$prefix/lib/libharrier.so.0" | grep -c 'RPATH\|RUNPATH')" -eq 0 ]
}
check "libharrier.so needs only system libraries" needs_only_system
check "pkg-config finds harrier" env PKG_CONFIG_PATH="$prefix/lib/pkgconfig" \
  pkg-config --exact-version=0.1.0 harrier

# --- the README's program, built outside the repository ---------------------
mkdir -p "$work/pc" "$work/cmake"
cp "$root/examples/own_loop.cc" "$work/pc/"
cp "$root/examples/own_loop.cc" "$work/cmake/"
# The README's listings are the files built here: its ```cpp block is
# own_loop.cc, its ```cmake block the CMakeLists.txt.
readme_block() {  # language: the first fenced block of it in the README's section
  awk -v lang="$1" '
    /^## Writing your own training loop/ { in_section = 1; next }
    in_section && /^## / { exit }
    in_section && !done && $0 == "```" lang { in_block = 1; next }
    in_block && $0 == "```" { in_block = 0; done = 1; next }
    in_block { print }' "$root/README.md"
}
readme_block cmake >"$work/cmake/CMakeLists.txt"
check "README shows examples/own_loop.cc as it is" \
  diff <(readme_block cpp) "$root/examples/own_loop.cc"
check "README has a CMakeLists.txt with find_package(harrier)" \
  grep -q 'find_package(harrier REQUIRED)' "$work/cmake/CMakeLists.txt"

build_pkg_config() {
  cd "$work/pc" &&
    PKG_CONFIG_PATH="$prefix/lib/pkgconfig" &&
    export PKG_CONFIG_PATH &&
    g++ -std=c++17 -O2 own_loop.cc $(pkg-config --cflags --libs harrier) -o own_loop
}
check "g++ + pkg-config build" build_pkg_config
check "cmake configure" cmake -S "$work/cmake" -B "$work/cmake/build" \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release
check "cmake build" cmake --build "$work/cmake/build"

# The test can fail: the same build with a header missing from the install.
broken_install_fails() {
  cp -a "$prefix" "$TEST_TMPDIR/broken" &&
    rm "$TEST_TMPDIR/broken/include/harrier/worker/operation_handle.h" &&
    sed -i "s|^prefix=.*|prefix=$TEST_TMPDIR/broken|" "$TEST_TMPDIR/broken/lib/pkgconfig/harrier.pc" &&
    cd "$work/pc" &&
    ! g++ -std=c++17 -fsyntax-only own_loop.cc \
        $(PKG_CONFIG_PATH="$TEST_TMPDIR/broken/lib/pkgconfig" pkg-config --cflags harrier)
}
check "a header missing from the install breaks the build" broken_install_fails

# --- each program trains against a real server ------------------------------
server_pid=""
trap '[ -n "$server_pid" ] && kill "$server_pid" 2>/dev/null; wait 2>/dev/null' EXIT
# A fresh server per program: a worker that called Leave() has left the job
# for good, and the next program would get its rank back.
trains() {  # program
  local port_file="$TEST_TMPDIR/port.$RANDOM" out="$TEST_TMPDIR/out.txt" loss rc
  "$root/server/harrier-server" --host=127.0.0.1 --port=0 --port_file="$port_file" \
    --num_workers=1 2>>"$TEST_TMPDIR/server.log" &
  server_pid=$!
  for _ in $(seq 300); do [ -s "$port_file" ] && break; sleep 0.1; done
  [ -s "$port_file" ] || { echo "server did not start"; tail -n 5 "$TEST_TMPDIR/server.log"; return 1; }
  timeout 60 "$1" "127.0.0.1:$(cat "$port_file")" >"$out"
  rc=$?
  kill "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null; server_pid=""
  cat "$out"
  [ "$rc" -eq 0 ] || { echo "exit $rc"; return 1; }
  loss=$(sed -n 's/^rank=0 final_loss=\([^ ]*\)$/\1/p' "$out")
  [ -n "$loss" ] && awk -v loss="$loss" 'BEGIN { exit !(loss < 1e-3) }'
}
check "pkg-config build trains and converges" trains "$work/pc/own_loop"
check "cmake build trains and converges" trains "$work/cmake/build/own_loop"

# --- a timeline from a program built against the install -------------------
# The install has no timeline.h: Client::StartTimeline makes the file.
cat >"$work/pc/timeline.cc" <<'CC'
#include <cstdio>
#include <vector>

#include "worker/client.h"

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  harrier::ClientOptions options;
  options.servers = {argv[1]};
  auto client = harrier::Client::Create(options);
  absl::Status s = client.status();
  std::vector<float> w(1000, 1.0f);
  if (s.ok()) s = (*client)->RegisterTensor("w", {1000}, w);
  if (s.ok()) s = (*client)->StartTimeline(argv[2]);
  if (s.ok()) s = (*client)->Pull("w", absl::MakeSpan(w));
  if (s.ok()) s = (*client)->StopTimeline();
  if (s.ok()) s = (*client)->Leave();
  if (!s.ok()) std::fprintf(stderr, "timeline: %s\n", s.ToString().c_str());
  return s.ok() ? 0 : 1;
}
CC
records_timeline() {
  local port_file="$TEST_TMPDIR/port.timeline" trace="$TEST_TMPDIR/installed_timeline.json" rc
  (cd "$work/pc" && g++ -std=c++17 -O1 timeline.cc \
      $(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags --libs harrier) -o timeline) ||
    return 1
  "$root/server/harrier-server" --host=127.0.0.1 --port=0 --port_file="$port_file" \
    --num_workers=1 2>>"$TEST_TMPDIR/server.log" &
  server_pid=$!
  for _ in $(seq 300); do [ -s "$port_file" ] && break; sleep 0.1; done
  [ -s "$port_file" ] || { echo "server did not start"; return 1; }
  timeout 60 "$work/pc/timeline" "127.0.0.1:$(cat "$port_file")" "$trace"
  rc=$?
  kill "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null; server_pid=""
  [ "$rc" -eq 0 ] || { echo "exit $rc"; return 1; }
  # A whole JSON array with the pull on it.
  python3 -c 'import json, sys
events = json.load(open(sys.argv[1]))
pulls = [e for e in events if e.get("ph") == "X" and e["name"] == "pull of '"'"'w'"'"'"]
sys.exit(0 if len(pulls) == 1 else 1)' "$trace"
}
check "a program built against the install records a timeline" records_timeline

finish
