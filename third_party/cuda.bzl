"""cuda_objects: compiles .cu files with the toolkit's nvcc into a linkable cc_library.

Bazel 4.2.3 has no CUDA rules; a genrule runs nvcc once per .cu file, for the GPUs of
EC2's current instances (sm_75 T4, sm_80 A100, sm_86 A10G, sm_89 L4, sm_90 H100/H200)
plus PTX for newer ones. CUDA 13 cannot target sm_70 (V100).
"""

load("@local_cuda//:defs.bzl", "NVCC")

CUDA_ARCH_FLAGS = " ".join([
    "-gencode=arch=compute_75,code=sm_75",
    "-gencode=arch=compute_80,code=sm_80",
    "-gencode=arch=compute_86,code=sm_86",
    "-gencode=arch=compute_89,code=sm_89",
    "-gencode=arch=compute_90,code=sm_90",
    "-gencode=arch=compute_90,code=compute_90",
])

def cuda_objects(name, srcs, hdrs = [], deps = [], visibility = None):
    """One cc_library of the objects nvcc makes from `srcs` (which may include `hdrs`)."""
    objects = []
    for src in srcs:
        obj = src[:-len(".cu")] + ".cu.o"
        native.genrule(
            name = name + "_" + src.replace("/", "_").replace(".", "_"),
            srcs = [src] + hdrs,
            outs = [obj],
            cmd = "%s -c -O3 -std=c++17 -Xcompiler -fPIC %s -I. -o $@ $(location %s)" % (NVCC, CUDA_ARCH_FLAGS, src),
        )
        objects.append(obj)
    native.cc_library(
        name = name,
        srcs = objects,
        hdrs = hdrs,
        deps = deps,
        linkstatic = True,
        alwayslink = True,
        visibility = visibility,
    )
