"""One fuzz target, two builds: a seeded cc_test and a libFuzzer binary."""

load("@rules_cc//cc:defs.bzl", "cc_binary", "cc_test")

def harrier_fuzz_target(name, srcs, deps, args = [], size = "small"):
    """`name`: the target run by fuzz_driver.cc's fixed mutations (any
    compiler, in `bazel test`). `name`_libfuzzer: the same source linked
    with libFuzzer's main, tagged manual because only clang with
    --config=fuzz (.bazelrc) builds it."""
    cc_test(
        name = name,
        size = size,
        srcs = srcs,
        args = args,
        deps = deps + [":fuzz_driver"],
    )
    cc_binary(
        name = name + "_libfuzzer",
        testonly = True,
        srcs = srcs,
        linkopts = ["-fsanitize=fuzzer"],
        tags = ["manual"],
        deps = deps,
    )
