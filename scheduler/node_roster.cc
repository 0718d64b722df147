#include "scheduler/node_roster.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/security/secrets.h"

namespace paramserver {

absl::StatusOr<NodeRoster::Admission> NodeRoster::Admit(NodeRole role, const std::string& address,
                                                        const std::string& token_sha256,
                                                        absl::Time now,
                                                        const std::string& previous_token_sha256) {
  const bool server = role == NODE_ROLE_SERVER;
  for (RegistryNode& node : nodes_) {
    if (node.role == role && node.address == address && node.alive) {
      // The same process again (its reply was lost, perhaps by the scheduler this one
      // took over from): the same answer. Another process at a live node's address
      // must wait until that node is declared dead.
      if (ConstantTimeEquals(node.token_sha256, token_sha256)) return Admission{&node, true};
      return absl::UnavailableError(absl::StrCat(
          node.name, " at ", address,
          " is alive; another process there takes its place once it is declared dead (",
          cluster_.failure_timeout_ms, " ms without a heartbeat)"));
    }
  }
  const int expected = server ? cluster_.servers : cluster_.workers;
  const int most =
      server ? std::max(cluster_.servers, cluster_.max_servers) : WorkerSlots(cluster_);
  const int rank = CountRole(role);
  auto new_slot = [&]() -> RegistryNode* {
    RegistryNode& node = nodes_.emplace_back();
    node.name = absl::StrCat(server ? "ps-" : "worker-", rank);
    node.role = role;
    node.rank = rank;
    node.address = address;
    node.last_heartbeat = now;
    node.token_sha256 = token_sha256;
    return &node;
  };
  if (rank < expected) return Admission{new_slot()};
  // The cluster is complete: take the slot of a dead (or drained) node of this role,
  // if any; else a new slot while the role's range allows one (the job grows).
  RegistryNode* slot = nullptr;
  for (RegistryNode& node : nodes_) {
    if (node.role == role && !node.alive && (slot == nullptr || node.address == address))
      slot = &node;
  }
  if (slot == nullptr && rank < most) {
    Admission grown{new_slot()};
    grown.rejoined = true;
    grown.grown = true;
    return grown;
  }
  if (slot == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the cluster already has its ", most, server ? " servers" : " workers",
                     most > expected ? " (its range's max)" : "", ", all alive; ", address,
                     " was not admitted"));
  }
  const bool same_process = !previous_token_sha256.empty() &&
                            ConstantTimeEquals(slot->token_sha256, previous_token_sha256);
  if (!same_process && slot->role == NODE_ROLE_WORKER) {
    const SlotTraining trained = TrainedBy(*slot);
    slot->earlier_samples = trained.samples;
    slot->earlier_seconds = trained.seconds;
    slot->earlier_processes = trained.processes;
    slot->summary = ReportFinishedRequest();
    slot->progress = NodeProgress();
  }
  slot->token_sha256 = token_sha256;
  slot->alive = true;
  slot->drained = false;
  slot->address = address;
  slot->last_heartbeat = now;
  slot->finished = false;
  slot->shard_map_conflicts = 0;  // a new process counts its own
  slot->told_to_stop = false;
  return Admission{slot, false, true, same_process};
}

SlotTraining TrainedBy(const RegistryNode& node) {
  SlotTraining trained{node.earlier_samples, node.earlier_seconds, node.earlier_processes};
  const bool reported = node.finished || node.summary.samples() > 0;
  const int64_t samples = reported ? node.summary.samples() : node.progress.samples();
  const double seconds = reported ? node.summary.seconds() : node.progress.training_seconds();
  trained.samples += samples;
  trained.seconds += seconds;
  if (samples > 0 || seconds > 0) ++trained.processes;
  return trained;
}

RegistryNode* NodeRoster::Find(const std::string& name) {
  for (RegistryNode& node : nodes_) {
    if (node.name == name) return &node;
  }
  return nullptr;
}

const RegistryNode* NodeRoster::Find(const std::string& name) const {
  return const_cast<NodeRoster*>(this)->Find(name);
}

const RegistryNode* NodeRoster::FindServer(const std::string& name) const {
  const RegistryNode* node = Find(name);
  return node != nullptr && node->role == NODE_ROLE_SERVER ? node : nullptr;
}

int NodeRoster::CountRole(NodeRole role) const {
  return static_cast<int>(std::count_if(nodes_.begin(), nodes_.end(),
                                        [role](const RegistryNode& n) { return n.role == role; }));
}

int NodeRoster::FinishedWorkers() const {
  return static_cast<int>(std::count_if(
      nodes_.begin(), nodes_.end(), [](const RegistryNode& n) { return n.alive && n.finished; }));
}

int NodeRoster::LiveWorkers() const {
  return static_cast<int>(std::count_if(nodes_.begin(), nodes_.end(), [](const RegistryNode& n) {
    return n.alive && n.role == NODE_ROLE_WORKER;
  }));
}

int NodeRoster::FinisherRank() const {
  int lowest = -1;
  for (const RegistryNode& node : nodes_) {
    if (node.role == NODE_ROLE_WORKER && node.alive && (lowest < 0 || node.rank < lowest))
      lowest = node.rank;
  }
  return lowest;
}

std::vector<ServerEndpoint> NodeRoster::Servers(bool live_only, const std::string& except) const {
  std::vector<ServerEndpoint> servers;
  for (const RegistryNode& node : nodes_) {
    if (node.role == NODE_ROLE_SERVER && (node.alive || !live_only) && node.name != except)
      servers.push_back({node.name, node.address});
  }
  return servers;
}

std::vector<bool> NodeRoster::ActiveWorkers() const {
  std::vector<bool> active(WorkerSlots(cluster_), false);
  for (const RegistryNode& node : nodes_) {
    if (node.role == NODE_ROLE_WORKER && node.alive) active[node.rank] = true;
  }
  return active;
}

void NodeRoster::AddCredentials(ShardMap* map) const {
  map->clear_credentials();
  for (const RegistryNode& node : nodes_) {
    if (!node.alive) continue;  // a dead node's credential dies with it
    NodeCredential* credential = map->add_credentials();
    credential->set_node_name(node.name);
    credential->set_role(node.role);
    credential->set_rank(node.rank);
    credential->set_token_sha256(node.token_sha256);
  }
}

std::vector<std::pair<std::string, absl::Duration>> NodeRoster::Silent(absl::Time now,
                                                                       absl::Duration timeout,
                                                                       bool job_over) const {
  std::vector<std::pair<std::string, absl::Duration>> silent;
  for (const RegistryNode& node : nodes_) {
    if (!node.alive || node.finished || (job_over && node.told_to_stop)) continue;
    if (now - node.last_heartbeat > timeout)
      silent.emplace_back(node.name, now - node.last_heartbeat);
  }
  return silent;
}

void NodeRoster::ExcludePause(absl::Duration pause, absl::Time now) {
  for (RegistryNode& node : nodes_) {
    if (node.alive) node.last_heartbeat = std::min(now, node.last_heartbeat + pause);
  }
}

void NodeRoster::Export(SchedulerState* state) const {
  for (const RegistryNode& node : nodes_) {
    SchedulerNodeState* saved = state->add_nodes();
    saved->set_name(node.name);
    saved->set_role(node.role);
    saved->set_rank(node.rank);
    saved->set_address(node.address);
    saved->set_alive(node.alive);
    saved->set_finished(node.finished);
    saved->set_drained(node.drained);
    saved->set_token_sha256(node.token_sha256);
    *saved->mutable_summary() = node.summary;
    saved->set_earlier_samples(node.earlier_samples);
    saved->set_earlier_seconds(node.earlier_seconds);
    saved->set_earlier_processes(node.earlier_processes);
  }
}

absl::Status NodeRoster::CheckSaved(const SchedulerState& state,
                                    std::set<std::string>* names) const {
  std::set<std::pair<int, int>> ranks;
  for (const SchedulerNodeState& saved : state.nodes()) {
    const bool server = saved.role() == NODE_ROLE_SERVER;
    if (!server && saved.role() != NODE_ROLE_WORKER) {
      return absl::DataLossError(
          absl::StrCat("node '", saved.name(), "' has no server or worker role"));
    }
    const int expected =
        server ? std::max(cluster_.servers, cluster_.max_servers) : WorkerSlots(cluster_);
    if (saved.rank() < 0 || saved.rank() >= expected) {
      return absl::DataLossError(absl::StrCat("node '", saved.name(), "' has rank ", saved.rank(),
                                              "; this spec has ", expected,
                                              server ? " servers" : " workers"));
    }
    if (saved.name().empty() || !names->insert(saved.name()).second) {
      return absl::DataLossError(
          absl::StrCat("the node name '", saved.name(), "' is empty or repeats"));
    }
    if (!ranks.insert({saved.role(), saved.rank()}).second) {
      return absl::DataLossError(
          absl::StrCat("two ", server ? "servers" : "workers", " have rank ", saved.rank()));
    }
  }
  return absl::OkStatus();
}

void NodeRoster::Import(const SchedulerState& state, absl::Time now) {
  nodes_.clear();
  for (const SchedulerNodeState& saved : state.nodes()) {
    RegistryNode& node = nodes_.emplace_back();
    node.name = saved.name();
    node.role = saved.role();
    node.rank = saved.rank();
    node.address = saved.address();
    node.alive = saved.alive();
    node.finished = saved.finished();
    node.drained = saved.drained();
    node.summary = saved.summary();
    node.token_sha256 = saved.token_sha256();
    node.earlier_samples = std::max<int64_t>(0, saved.earlier_samples());
    node.earlier_seconds =
        std::isfinite(saved.earlier_seconds()) ? std::max(0.0, saved.earlier_seconds()) : 0.0;
    node.earlier_processes = std::max(0, saved.earlier_processes());
    node.last_heartbeat = now;
  }
}

}  // namespace paramserver
