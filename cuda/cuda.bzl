"""nvcc through a genrule, shared by every package with .cu files.

There is no rules_cuda offline, so a .cu file becomes one PIC object that a
cc_library lists in its srcs (a name ending in .pic.o is what makes Bazel
link it into shared and static outputs alike). Keeping the command here
means //cuda and //worker/workload/cuda cannot drift apart in flags.
"""

# nvcc 13 accepts Debian's g++ 12 as host compiler. -fmad=false: no FMA
# contraction, so device arithmetic rounds like the CPU code's. -I. is the
# execution root, so .cu files include headers by their workspace path.
NVCC = ("/usr/local/cuda/bin/nvcc -c -std=c++17 -O2 -fmad=false " +
        "-Xcompiler -fPIC -I. " +
        "-gencode=arch=compute_80,code=sm_80 " +
        "-gencode=arch=compute_90,code=[sm_90,compute_90]")

CUDA_LINKOPTS = [
    "-L/usr/local/cuda/lib64",
    "-Wl,-rpath,/usr/local/cuda/lib64",
    "-lcudart",
]

def nvcc_object(name, hdrs = []):
    """Compiles name.cu (with the headers it includes) into name.pic.o.

    Tagged manual: a plain `bazel build //...` must never need nvcc.
    """
    native.genrule(
        name = name + "_o",
        srcs = [name + ".cu"] + hdrs,
        outs = [name + ".pic.o"],
        cmd = NVCC + " $(location " + name + ".cu) -o $@",
        tags = ["manual"],
    )
