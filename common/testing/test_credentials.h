// Credentials of a made-up cluster, for tests that run services in-process: the
// scheduler and every "ps-N" and "worker-N" (N < 64) have a token, and verifier()
// knows them all.
#ifndef PARAMSERVER_COMMON_TESTING_TEST_CREDENTIALS_H_
#define PARAMSERVER_COMMON_TESTING_TEST_CREDENTIALS_H_

#include <memory>
#include <string>

#include "common/security/peer_credentials.h"

namespace paramserver {

// Thread-safe.
class TestCredentials {
 public:
  static constexpr char kClusterToken[] = "test-cluster-token-0123456789";
  static constexpr int kNodesPerRole = 64;

  TestCredentials();

  // Checks callers against this cluster (for ParameterServerServiceImpl).
  const CallerVerifier* verifier() const { return &verifier_; }
  // The token of `node_name` ("scheduler", "ps-3", "worker-0").
  static std::string TokenOf(const std::string& node_name) { return "test-token-of-" + node_name; }
  // What `node_name` calls with: the cluster token and its identity (callers may
  // SetIdentity on it to act as another node).
  static std::shared_ptr<CallCredentials> As(const std::string& node_name);
  // The credentials' entries a shard map of this cluster carries.
  google::protobuf::RepeatedPtrField<NodeCredential> MapCredentials() const;

 private:
  KnownNodeTable table_;
  CallerVerifier verifier_;
};

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_TESTING_TEST_CREDENTIALS_H_
