"""Repository rule: one cc_library per Debian system library, via pkg-config."""

# name -> (pkg-config modules, extra linkopts)
_LIBS = {
    "grpc": (["grpc++", "protobuf"], ["-lgrpc++_reflection"]),
    "absl": (["absl_status", "absl_statusor", "absl_strings", "absl_str_format", "absl_synchronization", "absl_time", "absl_flags", "absl_flags_parse", "absl_random_random", "absl_hash", "absl_raw_hash_set"], []),
    "ucx": (["ucx"], []),
    "spdlog": (["spdlog", "fmt"], []),
    "zlib": (["zlib"], []),
    # OpenSSL's libcrypto (libssl-dev): HMAC-SHA256 of session credentials
    # (server/session.h).
    "crypto": (["libcrypto"], []),
    "openblas": (["openblas"], []),
    # prometheus-cpp 1.0 (package prometheus-cpp-dev): metric families and the
    # pull Exposer. Debian builds the Exposer on the system civetweb, which
    # has no .pc file; common/metrics calls civetweb for /healthz, so it links
    # it by name.
    "prometheus": (["prometheus-cpp-pull", "prometheus-cpp-core"], ["-lcivetweb-cpp", "-lcivetweb"]),
    # Gloo (package libgloo-dev, Debian's 2022 snapshot, tcp transport):
    # the all-reduce baseline (bench/allreduce). It ships no .pc file,
    # only CMake config; headers are in /usr/include/gloo and the library in
    # /usr/lib, both on the default search paths. libgloo.so itself records
    # its hiredis and ibverbs dependencies.
    "gloo": ([], ["-lgloo", "-pthread"]),
    # nlohmann/json 3.11 (package nlohmann-json3-dev, header-only): the one
    # JSON library for the JSON lines the benches and tools write and read.
    "nlohmann_json": (["nlohmann_json"], []),
    # Intel's ISA-L (package libisal-dev): CRC32C of every data message
    # (common/crc32c).
    "isal": (["libisal"], []),
}

def _split(text):
    return [t for t in text.strip().split(" ") if t]

def _pkg_config(ctx, modules, flag):
    result = ctx.execute(["pkg-config", flag] + modules)
    if result.return_code != 0:
        fail("pkg-config %s %s failed (run deploy/setup.sh): %s" % (flag, " ".join(modules), result.stderr))
    return _split(result.stdout)

def _system_libs_impl(ctx):
    lines = ['package(default_visibility = ["//visibility:public"])', ""]
    for name, (modules, extra) in _LIBS.items():
        mods = [m for m in modules]
        if name == "absl":
            # Not every Debian Abseil ships every module (absl_crc32c is newer); keep those present.
            mods = [m for m in modules if ctx.execute(["pkg-config", "--exists", m]).return_code == 0]
        # A library without a .pc file lists no modules: its linkopts say it all.
        cflags = _pkg_config(ctx, mods, "--cflags") if mods else []
        libs = _pkg_config(ctx, mods, "--libs") if mods else []
        defines = [f[2:] for f in cflags if f.startswith("-D")]
        copts = [f for f in cflags if not f.startswith("-D") and not f.startswith("-I/usr/include")]
        lines.append("cc_library(")
        lines.append('    name = "%s",' % name)
        lines.append("    defines = %s," % repr(defines))
        lines.append("    copts = %s," % repr(copts))
        lines.append("    linkopts = %s," % repr(libs + extra))
        lines.append(")")
        lines.append("")
    # Python's headers for extension modules (python/): not a pkg-config
    # library dependents can take copts from, so a constant to load. Debian's
    # own interpreter (python3-dev), never a python3 earlier on PATH.
    python = ctx.execute(["/usr/bin/python3-config", "--includes"])
    python_copts = _split(python.stdout) if python.return_code == 0 else []
    python_copts = ["-isystem" + f[2:] for f in python_copts if f.startswith("-I")]
    python_copts = [f for i, f in enumerate(python_copts) if f not in python_copts[:i]]
    ctx.file("python.bzl", "PYTHON_COPTS = %s\n" % repr(python_copts))
    ctx.file("BUILD", "\n".join(lines))
    ctx.file("WORKSPACE", "")

system_libs = repository_rule(
    implementation = _system_libs_impl,
    local = True,
    environ = ["PKG_CONFIG_PATH"],
)
