#include "worker/rpc_fault_injector.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace paramserver {

absl::StatusOr<RpcFaultOptions> ParseRpcFaultOptions(const std::string& text) {
  RpcFaultOptions options;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipEmpty())) {
    std::pair<std::string, std::string> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
    double number = 0;
    if (!absl::SimpleAtod(kv.second, &number) || number < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("rpc faults: '", item, "' needs a non-negative number"));
    }
    if (kv.first == "drop_request" && number <= 1) {
      options.drop_request = number;
    } else if (kv.first == "drop_response" && number <= 1) {
      options.drop_response = number;
    } else if (kv.first == "delay_ms") {
      options.delay = absl::Milliseconds(number);
    } else if (kv.first == "seed") {
      options.seed = static_cast<uint64_t>(number);
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "rpc faults: unknown or out-of-range item '", item,
          "' (known: drop_request=P, drop_response=P with P in [0, 1], delay_ms=N, seed=N)"));
    }
  }
  return options;
}

RpcFaultInjector::RpcFaultInjector(RpcFaultOptions options)
    : options_(options), generator_(options.seed) {}

RpcFault RpcFaultInjector::NextCall() {
  absl::MutexLock lock(&mu_);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  RpcFault fault;
  fault.delay = options_.delay;
  fault.drop_request = unit(generator_) < options_.drop_request;
  fault.drop_response = !fault.drop_request && unit(generator_) < options_.drop_response;
  dropped_requests_ += fault.drop_request;
  dropped_responses_ += fault.drop_response;
  return fault;
}

int64_t RpcFaultInjector::dropped_requests() const {
  absl::MutexLock lock(&mu_);
  return dropped_requests_;
}

int64_t RpcFaultInjector::dropped_responses() const {
  absl::MutexLock lock(&mu_);
  return dropped_responses_;
}

}  // namespace paramserver
