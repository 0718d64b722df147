// A server as StartRpcServer makes it, over gRPC on 127.0.0.1: what it tells a caller
// without credentials, and the limit on what it reads; a channel as CreateChannel makes
// it: how soon it reaches a peer back from an outage.
#include "common/rpc/rpc_endpoints.h"

#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "catch2/catch.hpp"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/byte_buffer.h"

namespace paramserver {
namespace {

// Calls `method` with `bytes` on `channel`; the reply's bytes go to *reply.
grpc::Status RawCall(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                     const std::string& bytes, std::string* reply = nullptr) {
  grpc::GenericStub generic(channel);
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

// The same on a channel of its own.
grpc::Status RawCall(const std::string& address, const std::string& method,
                     const std::string& bytes, std::string* reply = nullptr) {
  return RawCall(CreateChannel(address), method, bytes, reply);
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

TEST_CASE("a channel reaches a peer back from a long outage within its reconnect backoff") {
  absl::StatusOr<RunningServer> first = StartRpcServer("127.0.0.1:0", {}, 64 << 10);
  REQUIRE(first.ok());
  const std::string address = "127.0.0.1:" + std::to_string(first->port);
  const std::shared_ptr<grpc::Channel> channel = CreateChannel(address);
  REQUIRE(RawCall(channel, "/grpc.health.v1.Health/Check", HealthRequest("")).ok());
  first->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
  first->server.reset();
  // An outage of 6 s, called through all along. gRPC's own backoff (1 s, x1.6 each
  // failed attempt, +-20%) would have its next attempt 1.6 s or more after the peer is
  // back; ours is at most kMaxReconnectBackoff + 20% (0.6 s).
  const absl::Time outage_ends = absl::Now() + absl::Seconds(6);
  while (absl::Now() < outage_ends) {
    CHECK_FALSE(RawCall(channel, "/grpc.health.v1.Health/Check", HealthRequest("")).ok());
    absl::SleepFor(absl::Milliseconds(50));
  }
  absl::StatusOr<RunningServer> back = StartRpcServer(address, {}, 64 << 10);
  REQUIRE(back.ok());
  const absl::Time back_at = absl::Now();
  while (!RawCall(channel, "/grpc.health.v1.Health/Check", HealthRequest("")).ok() &&
         absl::Now() - back_at < absl::Seconds(10)) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  const absl::Duration reached_after = absl::Now() - back_at;
  INFO("reached again after " << absl::FormatDuration(reached_after));
  CHECK(reached_after < 1.2 * kMaxReconnectBackoff + absl::Milliseconds(600));
  back->server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
}

}  // namespace
}  // namespace paramserver
