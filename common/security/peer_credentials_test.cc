#include "common/security/peer_credentials.h"

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "catch2/catch.hpp"
#include "common/security/secrets.h"

namespace paramserver {
namespace {

// Client metadata as a server sees it, built from what a client attaches.
class Presented {
 public:
  explicit Presented(const CallCredentials& credentials) : pairs_(credentials.Metadata()) {
    for (const auto& [key, value] : pairs_)
      metadata_.emplace(grpc::string_ref(key), grpc::string_ref(value));
  }
  const ClientMetadata& metadata() const { return metadata_; }

 private:
  std::vector<std::pair<std::string, std::string>> pairs_;
  ClientMetadata metadata_;
};

TEST_CASE("secrets: fresh tokens differ, SHA-256 is the standard one, equality is exact") {
  const std::string a = NewSecretToken(), b = NewSecretToken();
  CHECK(a.size() == 64);
  CHECK(a != b);
  // FIPS 180-2's example: SHA-256("abc").
  CHECK(absl::BytesToHexString(Sha256("abc")) ==
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(ConstantTimeEquals("secret-token", "secret-token"));
  CHECK_FALSE(ConstantTimeEquals("secret-token", "secret-tokeN"));
  CHECK_FALSE(ConstantTimeEquals("secret-token", "secret-token0"));
  CHECK_FALSE(ConstantTimeEquals("", "x"));
}

TEST_CASE("membership: the cluster token is required when the cluster has one") {
  KnownNodeTable table;
  const CallerVerifier verifier("cluster-secret-0123456789", table.AsLookup());
  CHECK(verifier.CheckMembership(Presented(CallCredentials("cluster-secret-0123456789")).metadata())
            .ok());
  const absl::Status none = verifier.CheckMembership(Presented(CallCredentials("")).metadata());
  CHECK(none.code() == absl::StatusCode::kUnauthenticated);
  CHECK(absl::StrContains(none.message(), "no cluster token"));
  const absl::Status wrong =
      verifier.CheckMembership(Presented(CallCredentials("cluster-secret-0123456780")).metadata());
  CHECK(wrong.code() == absl::StatusCode::kUnauthenticated);
  CHECK(absl::StrContains(wrong.message(), "wrong cluster token"));
  // A cluster without a token checks no membership.
  CHECK(CallerVerifier("", table.AsLookup())
            .CheckMembership(Presented(CallCredentials("")).metadata())
            .ok());
}

TEST_CASE("identity: a node proves its name with its current token, and only its own") {
  const std::string worker_token = NewSecretToken(), server_token = NewSecretToken(),
                    scheduler_token = NewSecretToken();
  KnownNodeTable table;
  table.SetScheduler(Sha256(scheduler_token), "");
  google::protobuf::RepeatedPtrField<NodeCredential> credentials;
  NodeCredential* worker = credentials.Add();
  worker->set_node_name("worker-1");
  worker->set_role(NODE_ROLE_WORKER);
  worker->set_rank(1);
  worker->set_token_sha256(Sha256(worker_token));
  NodeCredential* server = credentials.Add();
  server->set_node_name("ps-0");
  server->set_role(NODE_ROLE_SERVER);
  server->set_rank(0);
  server->set_token_sha256(Sha256(server_token));
  // A map cannot make anyone the scheduler.
  NodeCredential* fake_scheduler = credentials.Add();
  fake_scheduler->set_node_name(kSchedulerNodeName);
  fake_scheduler->set_token_sha256(Sha256(worker_token));
  table.ReplaceNodes(credentials);
  const CallerVerifier verifier("cluster-secret-0123456789", table.AsLookup());

  CallCredentials as_worker("cluster-secret-0123456789");
  as_worker.SetIdentity("worker-1", worker_token);
  absl::StatusOr<VerifiedCaller> caller = verifier.Identify(Presented(as_worker).metadata());
  REQUIRE(caller.ok());
  CHECK(caller->name == "worker-1");
  CHECK(caller->role == NODE_ROLE_WORKER);
  CHECK(caller->rank == 1);
  CHECK(RequireRole(*caller, NODE_ROLE_WORKER, "push").ok());
  const absl::Status not_server = RequireRole(*caller, NODE_ROLE_SERVER, "Replicate");
  CHECK(not_server.code() == absl::StatusCode::kPermissionDenied);
  CHECK(not_server.message() == "Replicate is for servers; worker-1 is a worker");
  CHECK(RequireRole(*caller, NODE_ROLE_UNSPECIFIED, "InstallShardMap").message() ==
        "InstallShardMap is for the scheduler; worker-1 is a worker");

  CallCredentials as_scheduler("cluster-secret-0123456789");
  as_scheduler.SetIdentity(kSchedulerNodeName, scheduler_token);
  absl::StatusOr<VerifiedCaller> scheduler = verifier.Identify(Presented(as_scheduler).metadata());
  REQUIRE(scheduler.ok());
  CHECK(RequireRole(*scheduler, NODE_ROLE_UNSPECIFIED, "InstallShardMap").ok());

  CallCredentials worker_claiming_server("cluster-secret-0123456789");
  worker_claiming_server.SetIdentity("ps-0", worker_token);
  CHECK(verifier.Identify(Presented(worker_claiming_server).metadata()).status().code() ==
        absl::StatusCode::kPermissionDenied);
  CallCredentials worker_claiming_scheduler("cluster-secret-0123456789");
  worker_claiming_scheduler.SetIdentity(kSchedulerNodeName, worker_token);
  CHECK(verifier.Identify(Presented(worker_claiming_scheduler).metadata()).status().code() ==
        absl::StatusCode::kPermissionDenied);
  CallCredentials stranger("cluster-secret-0123456789");
  stranger.SetIdentity("worker-9", worker_token);
  CHECK(verifier.Identify(Presented(stranger).metadata()).status().message() ==
        "no member is named 'worker-9'");
  CHECK(verifier.Identify(Presented(CallCredentials("cluster-secret-0123456789")).metadata())
            .status()
            .code() == absl::StatusCode::kUnauthenticated);
  // The right identity without membership is still refused.
  CallCredentials outsider_with_token("");
  outsider_with_token.SetIdentity("worker-1", worker_token);
  CHECK(verifier.Identify(Presented(outsider_with_token).metadata()).status().code() ==
        absl::StatusCode::kUnauthenticated);
  CHECK(as_worker.Presents("worker-1", Sha256(worker_token)));
  CHECK_FALSE(as_worker.Presents("worker-1", Sha256(server_token)));
  CHECK_FALSE(as_worker.Presents("ps-0", Sha256(worker_token)));
  // A new map without the node revokes it.
  table.ReplaceNodes({});
  CHECK(verifier.Identify(Presented(as_worker).metadata()).status().code() ==
        absl::StatusCode::kPermissionDenied);
}

}  // namespace
}  // namespace paramserver
