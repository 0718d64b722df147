#include "common/security/security_policy.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/security/secrets.h"

namespace paramserver {

absl::StatusOr<std::string> ReadClusterToken(const SecuritySection& security) {
  if (security.cluster_token_file.empty()) return std::string();
  return ReadSecretFile(security.cluster_token_file, "cluster token");
}

bool IsLoopbackHost(const std::string& host) {
  return host == "localhost" || host == "::1" || host == "[::1]" || absl::StartsWith(host, "127.");
}

absl::Status CheckListenAddressIsSafe(const std::string& listen_address,
                                      const SecuritySection& security) {
  const size_t colon = listen_address.rfind(':');
  const std::string host =
      colon == std::string::npos ? listen_address : listen_address.substr(0, colon);
  if (IsLoopbackHost(host) || !security.tls_ca.empty() || !security.cluster_token_file.empty() ||
      security.allow_insecure) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(
      absl::StrCat("refusing to listen on ", listen_address,
                   " with neither TLS nor a cluster token: anyone who can reach it could join or "
                   "end the job. Set "
                   "security.cluster_token_file (and security.tls on untrusted networks), or "
                   "security.allow_insecure: true"));
}

}  // namespace paramserver
