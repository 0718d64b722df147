#include "worker/rpc_fault_injector.h"

#include "catch2/catch.hpp"

namespace paramserver {
namespace {

TEST_CASE("fault options parse, and bad ones are named") {
  absl::StatusOr<RpcFaultOptions> options =
      ParseRpcFaultOptions("drop_request=0.1,drop_response=0.2,delay_ms=3,seed=9");
  REQUIRE(options.ok());
  CHECK(options->drop_request == 0.1);
  CHECK(options->drop_response == 0.2);
  CHECK(options->delay == absl::Milliseconds(3));
  CHECK(options->seed == 9);
  CHECK(std::string(ParseRpcFaultOptions("drop_request=2").status().message())
            .find("'drop_request=2'") != std::string::npos);
  CHECK_FALSE(ParseRpcFaultOptions("drop_everything=0.5").ok());
  CHECK_FALSE(ParseRpcFaultOptions("drop_request=x").ok());
}

TEST_CASE("faults come at the configured rates, reproducibly") {
  RpcFaultInjector first({0.1, 0.2, absl::ZeroDuration(), 5});
  RpcFaultInjector second({0.1, 0.2, absl::ZeroDuration(), 5});
  for (int i = 0; i < 10000; ++i) {
    RpcFault a = first.NextCall(), b = second.NextCall();
    CHECK((a.drop_request == b.drop_request && a.drop_response == b.drop_response));
    CHECK_FALSE((a.drop_request && a.drop_response));
  }
  // Binomial counts (seeded, so these exact numbers recur): 10000 calls at p = 0.1 have
  // mean 1000 and standard deviation sqrt(10000 x 0.1 x 0.9) = 30; responses drop at
  // 0.2 of the 0.9 not dropped before: mean 1800, sd sqrt(10000 x 0.18 x 0.82) = 38.
  // The margins are 5 standard deviations.
  CHECK(first.dropped_requests() == Approx(1000).margin(150));
  CHECK(first.dropped_responses() == Approx(1800).margin(200));
}

}  // namespace
}  // namespace paramserver
