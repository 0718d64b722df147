// The scheduler's membership record: every node that registered, its slot (role and
// rank), its address, whether it is alive, and its credential's digest. Which node may
// take which slot, and who the live servers and workers are, is decided here.
#ifndef PARAMSERVER_SCHEDULER_NODE_ROSTER_H_
#define PARAMSERVER_SCHEDULER_NODE_ROSTER_H_

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/config/cluster_spec.h"
#include "common/security/peer_credentials.h"
#include "proto/admin.pb.h"
#include "proto/scheduler.pb.h"
#include "scheduler/shard_placement.h"

namespace paramserver {

// What the scheduler knows of one node.
struct RegistryNode {
  std::string name;
  NodeRole role = NODE_ROLE_UNSPECIFIED;
  int rank = 0;
  std::string address;
  bool alive = true;
  absl::Time last_heartbeat;
  NodeProgress progress;
  bool finished = false;
  bool told_to_stop = false;
  bool drained = false;  // shards moved away on request; told to exit
  // The map that drained it: the node is told to exit once it serves that map (it
  // hands its unreplicated shards off while installing it), not before.
  int64_t drained_at_epoch = 0;
  ReportFinishedRequest summary;
  std::string token_sha256;  // of its credential (the registry never holds the credential)
  CheckpointTrouble checkpoint_trouble;  // servers: as their last heartbeat said
  int64_t shard_map_conflicts = 0;       // servers: maps they refused as conflicting
  int64_t refused_gradients = 0;         // servers: as their last heartbeat said
  // Servers, as their last heartbeat said: the epoch they serve, and the shards they
  // back up with the copy done (they follow the primary's log).
  int64_t serving_epoch = 0;
  std::set<int> ready_backups;
  int64_t ready_backups_epoch = 0;  // the epoch of the heartbeat that listed them
  // Servers, async mode: per worker rank, the step after its last push any shard here
  // applied (HeartbeatRequest.worker_next_steps), as of map pushes_reported_at_epoch
  // (0: never reported).
  std::vector<int64_t> worker_next_steps;
  int64_t pushes_reported_at_epoch = 0;
  // Workers: what the earlier processes of this slot trained (a worker restarted or
  // replaced); the present one's is its summary, or its progress until it finishes.
  int64_t earlier_samples = 0;
  double earlier_seconds = 0;
  int earlier_processes = 0;
};

// What every process that held a worker's slot trained: examples, and the seconds they
// trained for (one after the other: summed), the present process included (its summary
// once it finished, else its last heartbeat's figures).
struct SlotTraining {
  int64_t samples = 0;
  double seconds = 0;
  int processes = 0;
};
SlotTraining TrainedBy(const RegistryNode& node);

// Thread-compatible: the registry's lock guards it. Node pointers it returns stay valid
// until the next Admit or Import.
class NodeRoster {
 public:
  // `cluster`: how many servers and workers the job has (the slots).
  explicit NodeRoster(ClusterSection cluster) : cluster_(std::move(cluster)) {}

  // Where a registering process goes.
  struct Admission {
    RegistryNode* node = nullptr;
    bool repeat = false;    // the same process again (its token): nothing changed
    bool rejoined = false;  // it took a dead or drained node's slot
    // Rejoined: the slot's own process registering again (it was stopped or cut off
    // past the failure timeout), not a new one taking it over.
    bool same_process = false;
    // A new slot past the spec's starting count (servers: {min, max}): the job grew.
    // `rejoined` is set too: the map takes it in as it takes in a returning node.
    bool grown = false;
  };
  // Admits the process at `address` with credential digest `token_sha256` to a slot of
  // `role`: a new slot (name "ps-<rank>" / "worker-<rank>", ranks in registration
  // order) while the cluster is short of its spec, else a dead or drained node's
  // (preferring one last at this address), else a new slot while the role's range
  // (cluster.servers' max) allows one. The same role, address and token as a live
  // node is a repeat. UNAVAILABLE for another token at a live node's address (until
  // that node is declared dead); RESOURCE_EXHAUSTED when no slot is free.
  // REQUIRES: role SERVER or WORKER.
  // `previous_token_sha256`: the digest of the token the process last registered with
  // (empty: none); equal to a dead slot's, it is that slot's own process coming back.
  absl::StatusOr<Admission> Admit(NodeRole role, const std::string& address,
                                  const std::string& token_sha256, absl::Time now,
                                  const std::string& previous_token_sha256 = "");

  RegistryNode* Find(const std::string& name);
  const RegistryNode* Find(const std::string& name) const;
  const RegistryNode* FindServer(const std::string& name) const;
  const std::vector<RegistryNode>& nodes() const { return nodes_; }

  int CountRole(NodeRole role) const;
  int FinishedWorkers() const;
  int LiveWorkers() const;
  // The lowest rank among live workers (-1: none): who reports the final result.
  int FinisherRank() const;
  // Every server (`live_only`: the live ones) but `except`, in rank order.
  std::vector<ServerEndpoint> Servers(bool live_only, const std::string& except = "") const;
  // Per worker rank, whether it is a live worker (the map's active set).
  std::vector<bool> ActiveWorkers() const;
  // Every live node's credential digest into `map` (a dead node's dies with it).
  void AddCredentials(ShardMap* map) const;
  // Live nodes not finished (nor, once the job is over, told to stop) whose last
  // heartbeat is older than `timeout`, with how long they have been silent.
  std::vector<std::pair<std::string, absl::Duration>> Silent(absl::Time now, absl::Duration timeout,
                                                             bool job_over) const;
  // The scheduler did not run for `pause` up to `now`: no live node's silence counts
  // that time (each last heartbeat moves `pause` later, to `now` at most).
  void ExcludePause(absl::Duration pause, absl::Time now);

  // The nodes' durable part into `state`, and back. CheckSaved: DATA_LOSS for nodes
  // this spec cannot hold (a role that is neither, a rank beyond its servers or
  // workers, a repeated or empty name or rank); *names gets the saved names. Import
  // REQUIRES CheckSaved ok; every node counts as heard from at `now`.
  void Export(SchedulerState* state) const;
  absl::Status CheckSaved(const SchedulerState& state, std::set<std::string>* names) const;
  void Import(const SchedulerState& state, absl::Time now);

 private:
  const ClusterSection cluster_;
  std::vector<RegistryNode> nodes_;
};

}  // namespace paramserver

#endif  // PARAMSERVER_SCHEDULER_NODE_ROSTER_H_
