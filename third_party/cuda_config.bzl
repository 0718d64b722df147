"""local_cuda: the CUDA toolkit of this machine, if it has one.

Looks for nvcc and cuBLAS under $CUDA_PATH (default /usr/local/cuda). Writes
@local_cuda//:defs.bzl with CUDA_AVAILABLE and NVCC, and, where the toolkit exists,
@local_cuda//:cuda (headers, static cudart, cuBLAS). Build without CUDA on a machine
that has it with --repo_env=PS_CUDA=0.
"""

def _local_cuda_impl(ctx):
    cuda_path = ctx.os.environ.get("CUDA_PATH", "/usr/local/cuda")
    disabled = ctx.os.environ.get("PS_CUDA", "1") == "0"
    nvcc = ctx.path(cuda_path + "/bin/nvcc")
    available = (not disabled and nvcc.exists and
                 ctx.path(cuda_path + "/include/cublas_v2.h").exists and
                 ctx.path(cuda_path + "/lib64/libcudart_static.a").exists)
    ctx.file("WORKSPACE", "")
    ctx.file("defs.bzl", "\n".join([
        "CUDA_AVAILABLE = %s" % ("True" if available else "False"),
        'NVCC = "%s"' % (str(nvcc) if available else ""),
        'CUDA_PATH = "%s"' % cuda_path,
        "",
    ]))
    build = ['package(default_visibility = ["//visibility:public"])', 'exports_files(["defs.bzl"])', ""]
    if available:
        ctx.symlink(cuda_path + "/include", "include")
        build.append("""cc_library(
    name = "cuda",
    hdrs = glob(["include/*.h", "include/crt/*.h", "include/crt/*.hpp", "include/*.hpp"]),
    includes = ["include"],
    linkopts = [
        "-L{path}/lib64",
        "-Wl,-rpath,{path}/lib64",
        "-lcublas",
        "-lcudart",
    ],
)
""".format(path = cuda_path))
    ctx.file("BUILD", "\n".join(build))

local_cuda = repository_rule(
    implementation = _local_cuda_impl,
    environ = ["CUDA_PATH", "PS_CUDA"],
    local = True,
)
