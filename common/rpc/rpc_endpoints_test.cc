// A server as StartRpcServer makes it, over gRPC on 127.0.0.1: what it tells a caller
// without credentials, and the limit on what it reads.
#include "common/rpc/rpc_endpoints.h"

#include <string>

#include "absl/synchronization/mutex.h"
#include "catch2/catch.hpp"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/byte_buffer.h"

namespace paramserver {
namespace {

// Calls `method` with `bytes`; the reply's bytes go to *reply.
grpc::Status RawCall(const std::string& address, const std::string& method,
                     const std::string& bytes, std::string* reply = nullptr) {
  grpc::GenericStub generic(CreateChannel(address));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1), response;
  grpc::Status result;
  bool done = false;
  absl::Mutex mu;
  generic.UnaryCall(&context, method, grpc::StubOptions(), &request, &response,
                    [&](grpc::Status status) {
                      absl::MutexLock lock(&mu);
                      result = status;
                      done = true;
                    });
  absl::MutexLock lock(&mu);
  mu.Await(absl::Condition(&done));  // the call's deadline ends it
  if (result.ok() && reply != nullptr) {
    std::vector<grpc::Slice> slices;
    (void)response.Dump(&slices);
    for (const grpc::Slice& part : slices)
      reply->append(reinterpret_cast<const char*>(part.begin()), part.size());
  }
  return result;
}

// grpc.health.v1.HealthCheckRequest{service}.
std::string HealthRequest(const std::string& service) {
  return std::string(1, '\x0a') + std::string(1, static_cast<char>(service.size())) + service;
}

TEST_CASE("a server without services: health SERVING, no reflection, small messages only") {
  absl::StatusOr<RunningServer> running = StartRpcServer("127.0.0.1:0", {}, 64 << 10);
  REQUIRE(running.ok());
  const std::string address = "127.0.0.1:" + std::to_string(running->port);
  std::string health;
  REQUIRE(RawCall(address, "/grpc.health.v1.Health/Check", HealthRequest(""), &health).ok());
  CHECK(health == std::string("\x08\x01", 2));  // SERVING
  CHECK(RawCall(address, "/grpc.health.v1.Health/Check", HealthRequest("paramserver.Scheduler"))
            .error_code() == grpc::StatusCode::NOT_FOUND);
  CHECK(RawCall(address, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
                std::string("\x3a\x00", 2))
            .error_code() == grpc::StatusCode::UNIMPLEMENTED);
  CHECK(RawCall(address, "/paramserver.Scheduler/Register", "").error_code() ==
        grpc::StatusCode::UNIMPLEMENTED);
  // Past the limit: refused (UNIMPLEMENTED first, as any method here), never served.
  CHECK_FALSE(RawCall(address, "/paramserver.Scheduler/Register", std::string(1 << 20, 'x')).ok());
  std::string after;
  CHECK(RawCall(address, "/grpc.health.v1.Health/Check", HealthRequest(""), &after).ok());
  running->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
}

}  // namespace
}  // namespace paramserver
