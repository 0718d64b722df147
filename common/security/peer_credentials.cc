#include "common/security/peer_credentials.h"

#include "absl/strings/str_cat.h"
#include "common/security/secrets.h"

namespace paramserver {
namespace {

std::optional<absl::string_view> FindMetadata(const ClientMetadata& metadata, const char* key) {
  auto it = metadata.find(key);
  if (it == metadata.end()) return std::nullopt;
  return absl::string_view(it->second.data(), it->second.size());
}

absl::string_view RoleName(NodeRole role) {
  switch (role) {
    case NODE_ROLE_SERVER:
      return "server";
    case NODE_ROLE_WORKER:
      return "worker";
    default:
      return "the scheduler";
  }
}

}  // namespace

void CallCredentials::SetIdentity(const std::string& node_name, const std::string& node_token) {
  absl::MutexLock lock(&mu_);
  node_name_ = node_name;
  node_token_ = node_token;
}

std::vector<std::pair<std::string, std::string>> CallCredentials::Metadata() const {
  std::vector<std::pair<std::string, std::string>> pairs;
  if (!cluster_token_.empty()) pairs.emplace_back(kClusterTokenMetadata, cluster_token_);
  absl::MutexLock lock(&mu_);
  if (!node_name_.empty()) {
    pairs.emplace_back(kNodeNameMetadata, node_name_);
    pairs.emplace_back(kNodeTokenMetadata, node_token_);
  }
  return pairs;
}

bool CallCredentials::Presents(const std::string& node_name,
                               const std::string& token_sha256) const {
  absl::MutexLock lock(&mu_);
  return node_name_ == node_name && ConstantTimeEquals(Sha256(node_token_), token_sha256);
}

absl::Status CallerVerifier::CheckMembership(const ClientMetadata& metadata) const {
  if (cluster_token_.empty()) return absl::OkStatus();
  const std::optional<absl::string_view> presented = FindMetadata(metadata, kClusterTokenMetadata);
  if (!presented.has_value()) {
    return absl::UnauthenticatedError(
        "this job's daemons accept calls only from its members: no cluster token was presented "
        "(security.cluster_token_file)");
  }
  if (!ConstantTimeEquals(*presented, cluster_token_)) {
    return absl::UnauthenticatedError("wrong cluster token (security.cluster_token_file)");
  }
  return absl::OkStatus();
}

absl::StatusOr<VerifiedCaller> CallerVerifier::Identify(const ClientMetadata& metadata) const {
  if (absl::Status member = CheckMembership(metadata); !member.ok()) return member;
  const std::optional<absl::string_view> name = FindMetadata(metadata, kNodeNameMetadata);
  const std::optional<absl::string_view> token = FindMetadata(metadata, kNodeTokenMetadata);
  if (!name.has_value() || !token.has_value()) {
    return absl::UnauthenticatedError(
        "no node credential: only a registered node may make this call");
  }
  // Names are short ("worker-12"); a longer one is nobody's, and is not echoed back.
  const std::string shown = name->size() <= 64 ? std::string(*name) : "(a 64+ byte name)";
  const std::optional<KnownNode> known = lookup_(std::string(*name));
  if (!known.has_value()) {
    return absl::PermissionDeniedError(absl::StrCat("no member is named '", shown, "'"));
  }
  if (!ConstantTimeEquals(Sha256(*token), known->token_sha256)) {
    return absl::PermissionDeniedError(
        absl::StrCat("the credential presented for ", shown, " is not ", shown, "'s current one"));
  }
  return VerifiedCaller{std::string(*name), known->role, known->rank};
}

absl::Status RequireRole(const VerifiedCaller& caller, NodeRole role, absl::string_view what) {
  const bool scheduler_wanted = role == NODE_ROLE_UNSPECIFIED;
  if (scheduler_wanted ? caller.is_scheduler() : (!caller.is_scheduler() && caller.role == role)) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(
      what, " is for ", scheduler_wanted ? "the scheduler" : RoleName(role),
      scheduler_wanted ? "" : "s", "; ", caller.name, " is ",
      caller.is_scheduler() ? "the scheduler" : absl::StrCat("a ", RoleName(caller.role))));
}

bool KnownNodeTable::SetScheduler(std::string token_sha256, std::string map_key) {
  absl::MutexLock lock(&mu_);
  const bool changed = !scheduler_.has_value() || scheduler_->token_sha256 != token_sha256 ||
                       scheduler_map_key_ != map_key;
  scheduler_ = KnownNode{NODE_ROLE_UNSPECIFIED, -1, std::move(token_sha256)};
  scheduler_map_key_ = std::move(map_key);
  return changed;
}

std::string KnownNodeTable::scheduler_map_key() const {
  absl::MutexLock lock(&mu_);
  return scheduler_map_key_;
}

void KnownNodeTable::ReplaceNodes(
    const google::protobuf::RepeatedPtrField<NodeCredential>& credentials) {
  std::map<std::string, KnownNode> nodes;
  for (const NodeCredential& credential : credentials) {
    if (credential.node_name() == kSchedulerNodeName)
      continue;  // only registration says who that is
    nodes[credential.node_name()] =
        KnownNode{credential.role(), credential.rank(), credential.token_sha256()};
  }
  absl::MutexLock lock(&mu_);
  nodes_ = std::move(nodes);
}

std::optional<KnownNode> KnownNodeTable::Find(const std::string& name) const {
  absl::MutexLock lock(&mu_);
  if (name == kSchedulerNodeName) return scheduler_;
  auto it = nodes_.find(name);
  if (it == nodes_.end()) return std::nullopt;
  return it->second;
}

}  // namespace paramserver
