"""A repository of Debian's system libraries, with link flags from pkg-config.

Debian's Abseil is dozens of small libraries; a hand-written -l list misses some
(undefined absl::debian3::Mutex). This rule asks pkg-config for every library at
fetch time and writes one cc_library per dependency with those flags.
"""

# Target name -> pkg-config modules ("*" entries expand to every installed absl_* module).
_PKG_CONFIG_TARGETS = {
    "absl": ["absl_*"],
    "grpc": ["grpc++", "grpc"],
    "protobuf": ["protobuf"],
    "spdlog": ["spdlog"],
    "yaml_cpp": ["yaml-cpp"],
    "zlib": ["zlib"],
    "openblas": ["openblas"],
    "httplib": ["cpp-httplib"],
    # The metrics registry and its text exposition (common/ops/metrics).
    "prometheus": ["prometheus-cpp-core"],
    # SHA-256 and constant-time comparison of credentials (common/security/secrets), HTTPS.
    "openssl": ["libssl", "libcrypto"],
    # gperftools' allocator for the daemons: it keeps freed megabyte buffers for reuse
    # where glibc unmaps them, so every shard-sized message paid page faults (see
    # docs/PERFORMANCE.md).
    "tcmalloc": ["libtcmalloc_minimal"],
}

# Libraries without a .pc file. (Not grpc++_reflection: linked in, its static
# initializer would serve reflection on every daemon, naming its services to callers
# without the cluster token; docs/SECURITY.md.)
_EXTRA_LINKOPTS = {}

def _expand_modules(ctx, modules):
    expanded = []
    for module in modules:
        if not module.endswith("*"):
            expanded.append(module)
            continue
        listing = ctx.execute(["pkg-config", "--list-all"])
        if listing.return_code != 0:
            fail("pkg-config --list-all failed: " + listing.stderr)
        prefix = module[:-1]
        for line in listing.stdout.splitlines():
            name = line.split(" ")[0]
            if name.startswith(prefix):
                expanded.append(name)
    return sorted(expanded)

def _pkg_config(ctx, flag, modules):
    result = ctx.execute(["pkg-config", flag] + modules)
    if result.return_code != 0:
        fail("pkg-config %s %s failed (is the -dev package installed? run deploy/install_deps.sh): %s" %
             (flag, " ".join(modules), result.stderr))
    return [f for f in result.stdout.strip().split(" ") if f]

def _dedupe_keep_last(flags):
    # Keeps the last occurrence of each flag so that link order stays valid.
    seen = {}
    out = []
    for flag in reversed(flags):
        if flag not in seen:
            seen[flag] = True
            out.append(flag)
    return list(reversed(out))

def _system_libs_impl(ctx):
    build = ['package(default_visibility = ["//visibility:public"])', ""]
    for target, modules in _PKG_CONFIG_TARGETS.items():
        modules = _expand_modules(ctx, modules)
        linkopts = _dedupe_keep_last(_pkg_config(ctx, "--libs", modules)) + _EXTRA_LINKOPTS.get(target, [])
        # -D flags must reach every dependent (spdlog's SPDLOG_FMT_EXTERNAL, for one).
        cflags = _pkg_config(ctx, "--cflags", modules)
        defines = _dedupe_keep_last([f[2:] for f in cflags if f.startswith("-D")])
        build.append("cc_library(")
        build.append('    name = "%s",' % target)
        build.append("    defines = %s," % repr(defines))
        build.append("    linkopts = %s," % repr(linkopts))
        build.append(")")
        build.append("")
    # The Python package's extension module (python/BUILD) compiles against Debian's
    # python3 headers, wherever this Debian keeps them; pybind11's are in /usr/include.
    python_includes = ["-isystem" + f[2:] for f in _pkg_config(ctx, "--cflags", ["python3"]) if f.startswith("-I")]
    ctx.file("python.bzl", "PYTHON_COPTS = %s\n" % repr(_dedupe_keep_last(python_includes)))
    ctx.file("WORKSPACE", "")
    ctx.file("BUILD", "\n".join(build))

system_libs = repository_rule(
    implementation = _system_libs_impl,
    local = True,
)
