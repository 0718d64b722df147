#include "common/testing/test_credentials.h"

#include "absl/strings/str_cat.h"
#include "common/security/secrets.h"

namespace paramserver {

TestCredentials::TestCredentials() : verifier_(kClusterToken, table_.AsLookup()) {
  table_.SetScheduler(Sha256(TokenOf(kSchedulerNodeName)), "");
  table_.ReplaceNodes(MapCredentials());
}

std::shared_ptr<CallCredentials> TestCredentials::As(const std::string& node_name) {
  auto credentials = std::make_shared<CallCredentials>(kClusterToken);
  credentials->SetIdentity(node_name, TokenOf(node_name));
  return credentials;
}

google::protobuf::RepeatedPtrField<NodeCredential> TestCredentials::MapCredentials() const {
  google::protobuf::RepeatedPtrField<NodeCredential> credentials;
  for (NodeRole role : {NODE_ROLE_SERVER, NODE_ROLE_WORKER}) {
    for (int rank = 0; rank < kNodesPerRole; ++rank) {
      NodeCredential* credential = credentials.Add();
      credential->set_node_name(absl::StrCat(role == NODE_ROLE_SERVER ? "ps-" : "worker-", rank));
      credential->set_role(role);
      credential->set_rank(rank);
      credential->set_token_sha256(Sha256(TokenOf(credential->node_name())));
    }
  }
  return credentials;
}

}  // namespace paramserver
