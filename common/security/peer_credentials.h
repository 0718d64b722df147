// Who is calling: the cluster token (membership) and the node credential (identity and
// role) that every call between the job's daemons carries, and their checks on the
// receiving side. docs/SECURITY.md describes the scheme; in short:
//  - every member holds the cluster token (security.cluster_token_file) and sends it
//    as metadata x-ps-cluster-token on every call: without it a service answers
//    UNAUTHENTICATED and reads nothing else of the request;
//  - the scheduler gives each node a random token when it registers (only the reply
//    carries it); the node sends x-ps-node (its name) and x-ps-node-token. The
//    scheduler keeps the tokens' SHA-256; servers learn the digests of every member
//    with the shard map, and the scheduler's own digest from their registration. So a
//    member can prove who it is, and no member can act as another.
#ifndef PARAMSERVER_COMMON_SECURITY_PEER_CREDENTIALS_H_
#define PARAMSERVER_COMMON_SECURITY_PEER_CREDENTIALS_H_

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "google/protobuf/repeated_field.h"
#include "grpcpp/server_context.h"
#include "proto/scheduler.pb.h"

namespace paramserver {

inline constexpr char kClusterTokenMetadata[] = "x-ps-cluster-token";
inline constexpr char kNodeNameMetadata[] = "x-ps-node";
inline constexpr char kNodeTokenMetadata[] = "x-ps-node-token";
// The name the scheduler calls servers as.
inline constexpr char kSchedulerNodeName[] = "scheduler";

// What this node sends with every call it makes. Thread-safe; shared by the channels
// of one daemon (rpc_endpoints' CreateChannel attaches it to each call).
class CallCredentials {
 public:
  // `cluster_token` empty: the cluster has none, and no x-ps-cluster-token is sent.
  explicit CallCredentials(std::string cluster_token) : cluster_token_(std::move(cluster_token)) {}

  // From now on calls also carry this identity (after registration; again after a
  // re-registration, which issues a new token).
  void SetIdentity(const std::string& node_name, const std::string& node_token)
      ABSL_LOCKS_EXCLUDED(mu_);

  // The metadata pairs to add to a call.
  std::vector<std::pair<std::string, std::string>> Metadata() const ABSL_LOCKS_EXCLUDED(mu_);

  // Whether the identity set is `node_name` with the token whose SHA-256 is `token_sha256`.
  bool Presents(const std::string& node_name, const std::string& token_sha256) const
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const std::string cluster_token_;
  mutable absl::Mutex mu_;
  std::string node_name_ ABSL_GUARDED_BY(mu_);
  std::string node_token_ ABSL_GUARDED_BY(mu_);
};

// A member as the receiving node knows it.
struct KnownNode {
  NodeRole role = NODE_ROLE_UNSPECIFIED;  // UNSPECIFIED: the scheduler
  int rank = -1;
  std::string token_sha256;
};

// A caller whose credential was checked.
struct VerifiedCaller {
  std::string name;
  NodeRole role = NODE_ROLE_UNSPECIFIED;
  int rank = -1;
  bool is_scheduler() const { return name == kSchedulerNodeName; }
};

using ClientMetadata = std::multimap<grpc::string_ref, grpc::string_ref>;

// Checks callers on a service. Thread-safe (the lookup must be too).
class CallerVerifier {
 public:
  // The member named `name` with the digest of its current token, or nullopt.
  using Lookup = std::function<std::optional<KnownNode>(const std::string& name)>;

  // `cluster_token` empty: membership is not checked (a job without a cluster token;
  // identities still are).
  CallerVerifier(std::string cluster_token, Lookup lookup)
      : cluster_token_(std::move(cluster_token)), lookup_(std::move(lookup)) {}

  // OK if the call carries the cluster token; UNAUTHENTICATED otherwise (no token, or
  // a wrong one; compared in constant time).
  absl::Status CheckMembership(const ClientMetadata& metadata) const;
  absl::Status CheckMembership(const grpc::ServerContextBase& context) const {
    return CheckMembership(context.client_metadata());
  }

  // Membership, then the node credential: the caller as its lookup knows it.
  // UNAUTHENTICATED without a node credential; PERMISSION_DENIED for a name the lookup
  // does not know or a token that is not that node's current one.
  absl::StatusOr<VerifiedCaller> Identify(const ClientMetadata& metadata) const;
  absl::StatusOr<VerifiedCaller> Identify(const grpc::ServerContextBase& context) const {
    return Identify(context.client_metadata());
  }

 private:
  const std::string cluster_token_;
  const Lookup lookup_;
};

// PERMISSION_DENIED "<what> is for <role>s; <caller> is a <its role>" unless `caller`
// has `role` (NODE_ROLE_UNSPECIFIED: the scheduler).
absl::Status RequireRole(const VerifiedCaller& caller, NodeRole role, absl::string_view what);

// The members a server knows: the scheduler (from registration) and every node of the
// shard map it serves. Thread-safe.
class KnownNodeTable {
 public:
  // The scheduler process's identity (its registration or heartbeat reply): the digest
  // of the token it calls as, and the public key its shard maps are signed with.
  // Returns whether it changed (a scheduler took over).
  bool SetScheduler(std::string token_sha256, std::string map_key) ABSL_LOCKS_EXCLUDED(mu_);
  // The key shard maps must be signed with; empty before registration.
  std::string scheduler_map_key() const ABSL_LOCKS_EXCLUDED(mu_);
  // Replaces every node but the scheduler with `credentials`.
  void ReplaceNodes(const google::protobuf::RepeatedPtrField<NodeCredential>& credentials)
      ABSL_LOCKS_EXCLUDED(mu_);
  std::optional<KnownNode> Find(const std::string& name) const ABSL_LOCKS_EXCLUDED(mu_);
  // A lookup for CallerVerifier over this table (which must outlive it).
  CallerVerifier::Lookup AsLookup() const {
    return [this](const std::string& name) { return Find(name); };
  }

 private:
  mutable absl::Mutex mu_;
  std::optional<KnownNode> scheduler_ ABSL_GUARDED_BY(mu_);
  std::string scheduler_map_key_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, KnownNode> nodes_ ABSL_GUARDED_BY(mu_);
};

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_SECURITY_PEER_CREDENTIALS_H_
