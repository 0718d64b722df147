"""cc_grpc_proto: C++ messages and gRPC stubs for one .proto, from the system's protoc."""

def cc_grpc_proto(name, src, deps = [], extra_srcs = [], visibility = None):
    """Generates <base>.pb.{h,cc} and <base>.grpc.pb.{h,cc} and wraps them in a cc_library.

    Include the result as "proto/<base>.pb.h" / "proto/<base>.grpc.pb.h". `extra_srcs`
    are the .proto files it imports; `deps` their cc_grpc_proto libraries.
    """
    base = src[:-len(".proto")]
    outs = [base + ext for ext in [".pb.h", ".pb.cc", ".grpc.pb.h", ".grpc.pb.cc"]]
    native.genrule(
        name = name + "_gen",
        srcs = [src] + extra_srcs,
        outs = outs,
        cmd = " ".join([
            "protoc",
            "--proto_path=.",
            "--cpp_out=$(GENDIR)",
            "--grpc_out=$(GENDIR)",
            "--plugin=protoc-gen-grpc=$$(command -v grpc_cpp_plugin)",
            "$(location %s)" % src,
        ]),
    )
    native.cc_library(
        name = name,
        srcs = [base + ".pb.cc", base + ".grpc.pb.cc"],
        hdrs = [base + ".pb.h", base + ".grpc.pb.h"],
        deps = deps + ["@system_libs//:grpc", "@system_libs//:protobuf"],
        visibility = visibility,
    )
