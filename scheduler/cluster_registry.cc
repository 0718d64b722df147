#include "scheduler/cluster_registry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "scheduler/shard_placement.h"

namespace paramserver {

ClusterRegistry::ClusterRegistry(ClusterSection cluster, int64_t total_parameters)
    : cluster_(std::move(cluster)), total_parameters_(total_parameters) {}

ClusterRegistry::Node* ClusterRegistry::FindNode(const std::string& name) {
  for (Node& node : nodes_) {
    if (node.name == name) return &node;
  }
  return nullptr;
}

int ClusterRegistry::CountRole(NodeRole role) const {
  return static_cast<int>(std::count_if(nodes_.begin(), nodes_.end(), [role](const Node& n) { return n.role == role; }));
}

int ClusterRegistry::FinishedWorkers() const {
  return static_cast<int>(std::count_if(nodes_.begin(), nodes_.end(), [](const Node& n) { return n.finished; }));
}

absl::StatusOr<RegisterResponse> ClusterRegistry::Register(NodeRole role, const std::string& address,
                                                           absl::Time now) {
  if (role != NODE_ROLE_SERVER && role != NODE_ROLE_WORKER) {
    return absl::InvalidArgumentError("register: role must be SERVER or WORKER");
  }
  if (address.find(':') == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("register: advertised address '", address, "' is not host:port"));
  }
  absl::MutexLock lock(&mu_);
  for (const Node& node : nodes_) {
    if (node.role == role && node.address == address) {
      RegisterResponse again;
      again.set_node_name(node.name);
      again.set_rank(node.rank);
      return again;
    }
  }
  const bool server = role == NODE_ROLE_SERVER;
  const int expected = server ? cluster_.servers : cluster_.workers;
  const int rank = CountRole(role);
  if (rank >= expected) {
    return absl::ResourceExhaustedError(absl::StrCat("the cluster already has its ", expected,
                                                     server ? " servers" : " workers", "; ", address,
                                                     " was not admitted"));
  }
  Node node;
  node.name = absl::StrCat(server ? "ps-" : "worker-", rank);
  node.role = role;
  node.rank = rank;
  node.address = address;
  node.last_heartbeat = now;
  nodes_.push_back(node);
  if (CountRole(NODE_ROLE_SERVER) == cluster_.servers && CountRole(NODE_ROLE_WORKER) == cluster_.workers) {
    std::vector<ServerEndpoint> servers;
    for (const Node& n : nodes_) {
      if (n.role == NODE_ROLE_SERVER) servers.push_back({n.name, n.address});
    }
    shard_map_ = PlaceShards(total_parameters_, cluster_.shards, servers, /*epoch=*/1);
  }
  RegisterResponse response;
  response.set_node_name(node.name);
  response.set_rank(rank);
  return response;
}

ClusterView ClusterRegistry::View() const {
  absl::MutexLock lock(&mu_);
  ClusterView view;
  view.set_ready(shard_map_.has_value());
  view.set_expected_servers(cluster_.servers);
  view.set_registered_servers(CountRole(NODE_ROLE_SERVER));
  view.set_expected_workers(cluster_.workers);
  view.set_registered_workers(CountRole(NODE_ROLE_WORKER));
  if (shard_map_.has_value()) *view.mutable_shard_map() = *shard_map_;
  view.set_workers_finished(FinishedWorkers());
  view.set_job_finished(result_.has_value());
  return view;
}

absl::StatusOr<HeartbeatResponse> ClusterRegistry::Heartbeat(const HeartbeatRequest& request, absl::Time now) {
  absl::MutexLock lock(&mu_);
  Node* node = FindNode(request.node_name());
  if (node == nullptr) {
    return absl::NotFoundError(absl::StrCat("heartbeat from unknown node '", request.node_name(), "'"));
  }
  node->last_heartbeat = now;
  node->reported_silent = false;
  node->progress = request.progress();
  if (result_.has_value()) node->told_to_stop = true;
  HeartbeatResponse response;
  response.set_epoch(shard_map_.has_value() ? shard_map_->epoch() : 0);
  response.set_job_finished(result_.has_value());
  return response;
}

absl::StatusOr<ReportFinishedResponse> ClusterRegistry::ReportFinished(const ReportFinishedRequest& request,
                                                                       absl::Time now) {
  absl::MutexLock lock(&mu_);
  Node* node = FindNode(request.node_name());
  if (node == nullptr || node->role != NODE_ROLE_WORKER) {
    return absl::NotFoundError(absl::StrCat("report from unknown worker '", request.node_name(), "'"));
  }
  node->finished = true;
  node->last_heartbeat = now;
  node->summary = request;
  ReportFinishedResponse response;
  response.set_workers_finished(FinishedWorkers());
  response.set_workers_total(cluster_.workers);
  return response;
}

absl::StatusOr<JobResult> ClusterRegistry::ReportResult(const ReportResultRequest& request) {
  absl::MutexLock lock(&mu_);
  Node* node = FindNode(request.node_name());
  if (node == nullptr || node->role != NODE_ROLE_WORKER || node->rank != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("the final result must come from worker-0, not '", request.node_name(), "'"));
  }
  if (FinishedWorkers() < cluster_.workers) {
    return absl::FailedPreconditionError(absl::StrCat("only ", FinishedWorkers(), " of ", cluster_.workers,
                                                      " workers have finished"));
  }
  JobResult result;
  result.test_accuracy = request.test_accuracy();
  int64_t samples = 0;
  double seconds = 0;
  for (const Node& n : nodes_) {
    if (n.role != NODE_ROLE_WORKER) continue;
    samples += n.summary.samples();
    seconds = std::max(seconds, n.summary.seconds());
    result.steps = std::max(result.steps, n.summary.steps());
  }
  result.samples_per_sec = seconds > 0 ? samples / seconds : 0;
  result_ = result;
  return result;
}

std::vector<SilentNode> ClusterRegistry::TakeNewlySilentNodes(absl::Time now, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  std::vector<SilentNode> silent;
  for (Node& node : nodes_) {
    if (node.finished || node.reported_silent || (result_.has_value() && node.told_to_stop)) continue;
    if (now - node.last_heartbeat > timeout) {
      node.reported_silent = true;
      silent.push_back({node.name, now - node.last_heartbeat});
    }
  }
  return silent;
}

bool ClusterRegistry::job_finished() const {
  absl::MutexLock lock(&mu_);
  return result_.has_value();
}

bool ClusterRegistry::all_servers_told_to_stop() const {
  absl::MutexLock lock(&mu_);
  return std::all_of(nodes_.begin(), nodes_.end(),
                     [](const Node& n) { return n.role != NODE_ROLE_SERVER || n.told_to_stop; });
}

}  // namespace paramserver
