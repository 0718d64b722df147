// Test-only faults in a client's RPCs: drop the request (the server never sees it),
// drop the response (the server applied it; the client sees a failure), or delay the
// call. Used to show that every retried mutation is applied exactly once.
#ifndef PARAMSERVER_WORKER_RPC_FAULT_INJECTOR_H_
#define PARAMSERVER_WORKER_RPC_FAULT_INJECTOR_H_

#include <cstdint>
#include <random>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace paramserver {

struct RpcFaultOptions {
  double drop_request = 0;   // probability per call
  double drop_response = 0;  // probability per call
  absl::Duration delay;      // added before every call
  uint64_t seed = 1;
};

// Parses "drop_request=0.05,drop_response=0.05,delay_ms=2,seed=7" (any subset).
// INVALID_ARGUMENT naming the bad item.
absl::StatusOr<RpcFaultOptions> ParseRpcFaultOptions(const std::string& text);

// What to do to one call.
struct RpcFault {
  bool drop_request = false;
  bool drop_response = false;
  absl::Duration delay;
};

// Thread-safe; seeded, so a failing run reproduces.
class RpcFaultInjector {
 public:
  explicit RpcFaultInjector(RpcFaultOptions options);

  RpcFault NextCall() ABSL_LOCKS_EXCLUDED(mu_);
  int64_t dropped_requests() const ABSL_LOCKS_EXCLUDED(mu_);
  int64_t dropped_responses() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const RpcFaultOptions options_;
  mutable absl::Mutex mu_;
  std::mt19937_64 generator_ ABSL_GUARDED_BY(mu_);
  int64_t dropped_requests_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t dropped_responses_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace paramserver

#endif  // PARAMSERVER_WORKER_RPC_FAULT_INJECTOR_H_
