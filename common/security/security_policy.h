// How a daemon applies the spec's security section at start-up: the cluster token it
// holds, and whether it may listen where it was asked to. docs/SECURITY.md.
#ifndef PARAMSERVER_COMMON_SECURITY_SECURITY_POLICY_H_
#define PARAMSERVER_COMMON_SECURITY_SECURITY_POLICY_H_

#include <string>

#include "absl/status/statusor.h"
#include "common/config/cluster_spec.h"

namespace paramserver {

// The cluster token from security.cluster_token_file; "" when none is configured.
// NOT_FOUND / INVALID_ARGUMENT naming the file when it cannot be read or is too short.
absl::StatusOr<std::string> ReadClusterToken(const SecuritySection& security);

// Whether `host` (of a host:port) is a loopback address: 127.0.0.0/8, ::1, localhost.
bool IsLoopbackHost(const std::string& host);

// OK when a daemon may listen on `listen_address`: a loopback address, or one with TLS
// or a cluster token configured, or security.allow_insecure. Otherwise
// FAILED_PRECONDITION, one line saying why and what to set.
absl::Status CheckListenAddressIsSafe(const std::string& listen_address,
                                      const SecuritySection& security);

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_SECURITY_SECURITY_POLICY_H_
