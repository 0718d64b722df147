// The scheduler's control plane at scale, in process: the real ClusterRegistry (what
// ps_scheduler runs behind its gRPC service) with N registered nodes, driven as the
// daemons drive it, timed.
//
//   control_plane_bench [--nodes=100,500,2000] [--rounds=5]
//
// For each size: N nodes, of which N/8 servers (256 at 2,000 nodes), 16 shards per
// server, replication 2, the rest workers. Every server heartbeats with its serving
// epoch and a status per shard it holds (primary or backup), every worker with its
// name, as the daemons do. Prints, per size:
//   heartbeat_us      the registry's time per heartbeat (median of `rounds` rounds of
//                     every node once)
//   heartbeat_core    the share of one core that heartbeats take at the default
//                     interval (500 ms: every node twice a second), registry only
//   answer_us         building and serializing one GetClusterView answer (what a
//                     worker's poll or long poll returns) as the service does: the map's
//                     bytes made once per map and shared; copied_answer_us the same from
//                     a copy of the whole view (as before); map_bytes its size
//   held_polls        the workers' long polls for a new map held meanwhile, as the
//                     service holds them (MapWaitList), as at a server's loss, while the
//                     heartbeats above are timed (all of them: the service holds 1,024
//                     at most, and the rest poll)
//   declare_dead_ms   declaring one server dead: planning recovery (promotions, new
//                     backups) and sealing (signing) the new map, map_publish_mb the
//                     bytes of that map sent once to every server and every worker
//   polls_answered_ms from the new map's publication until every held long poll has
//                     its answer built and serialized (gRPC's sending not included)
//   registry_mb       the process's resident memory growth while the registry was
//                     built and driven
// What it leaves out: gRPC's own cost per call and the network (a real ps_scheduler
// serves each heartbeat through gRPC, TLS where configured, and the token checks).
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "bench/bench_figures.h"
#include "google/protobuf/unknown_field_set.h"
#include "scheduler/cluster_registry.h"
#include "scheduler/map_wait_list.h"

ABSL_FLAG(std::string, nodes, "100,500,2000", "cluster sizes (servers and workers together)");
ABSL_FLAG(int, rounds, 5, "timed rounds of every node's heartbeat (the median is printed)");

namespace paramserver {
namespace {

constexpr int kShardsPerServer = 16;
constexpr double kHeartbeatsPerSecond = 2;  // cluster.heartbeat_interval_ms 500, the default

double ResidentMb() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atof(line.c_str() + 6) / 1024;
  }
  return 0;
}

// A GetClusterView answer built as the service builds it (the map's bytes made once
// per map and shared), serialized as gRPC sends it, into *wire.
void SerializedAnswer(const ClusterRegistry& registry, std::string* wire) {
  std::shared_ptr<const std::string> map_bytes;
  ClusterView answer = registry.ViewWithoutMap(&map_bytes);
  ClusterView::GetReflection()->MutableUnknownFields(&answer)->AddLengthDelimited(
      ClusterView::kShardMapFieldNumber, *map_bytes);
  answer.SerializeToString(wire);
}

std::string TokenOf(const std::string& address) {
  return "bench-node-token-" + address + std::string(32, 'x');
}

// Every node's heartbeat as its daemon would send it under `map`.
std::vector<HeartbeatRequest> Heartbeats(const ShardMap& map, int workers) {
  std::map<std::string, HeartbeatRequest> by_server;
  for (const ShardAssignment& assignment : map.shards()) {
    auto add = [&](const std::string& server, bool backup) {
      HeartbeatRequest& beat = by_server[server];
      beat.set_node_name(server);
      beat.set_serving_epoch(map.epoch());
      ShardStatus* status = beat.add_shards();
      status->set_shard_id(assignment.shard_id());
      status->set_applied_updates(1000);
      status->set_checkpoint_step(-1);
      status->set_backup(backup);
    };
    add(assignment.server_name(), false);
    for (const ShardReplica& backup : assignment.backups()) add(backup.server_name(), true);
  }
  std::vector<HeartbeatRequest> beats;
  for (auto& [name, beat] : by_server) beats.push_back(std::move(beat));
  for (int w = 0; w < workers; ++w) {
    HeartbeatRequest beat;
    beat.set_node_name("worker-" + std::to_string(w));
    beat.mutable_progress()->set_step(1000);
    beats.push_back(std::move(beat));
  }
  return beats;
}

int RunSize(int nodes, int rounds) {
  const int servers = nodes >= 2000 ? 256 : std::max(2, nodes / 8);
  const int workers = nodes - servers;
  const double rss_before = ResidentMb();
  RegistryOptions options;
  options.cluster.scheduler_address = "127.0.0.1:0";
  options.cluster.servers = servers;
  options.cluster.workers = workers;
  options.cluster.shards = kShardsPerServer * servers;
  options.cluster.replication = 2;
  options.mode = TrainingMode::kAsync;
  absl::StatusOr<ModelLayout> layout =
      ModelLayout::Create({{"weights", {int64_t{1000} * options.cluster.shards}}});
  if (!layout.ok()) {
    std::fprintf(stderr, "control_plane_bench: %s\n", layout.status().ToString().c_str());
    return 1;
  }
  options.layout = *std::move(layout);
  ClusterRegistry registry(options);
  absl::Time now = absl::Now();
  for (int i = 0; i < nodes; ++i) {
    const bool server = i < servers;
    const std::string address = (server ? "10.0.0." : "10.1.0.") + std::to_string(i) + ":7000";
    std::optional<MapChange> change;
    absl::StatusOr<RegisterResponse> registered = registry.Register(
        server ? NODE_ROLE_SERVER : NODE_ROLE_WORKER, address, TokenOf(address), now, &change);
    if (!registered.ok()) {
      std::fprintf(stderr, "control_plane_bench: registering node %d: %s\n", i,
                   registered.status().ToString().c_str());
      return 1;
    }
  }
  ClusterView view = registry.View();
  if (view.shard_map().shards_size() != options.cluster.shards) {
    std::fprintf(stderr, "control_plane_bench: no shard map after %d registrations\n", nodes);
    return 1;
  }
  const std::vector<HeartbeatRequest> beats = Heartbeats(view.shard_map(), workers);
  // Every worker waits for a map after this one, as the service holds such calls. What
  // the answers count is declared first: on an early return the list, destroyed first,
  // still calls its held answers.
  absl::Mutex answered_mu;
  int answered = 0;
  absl::Time last_answer;
  MapWaitList long_polls(workers, view.shard_map().epoch());
  registry.SetMapListener([&long_polls](int64_t epoch) { long_polls.Published(epoch); });
  for (int i = 0; i < workers; ++i) {
    const bool held = long_polls.Hold(view.shard_map().epoch(), absl::Now() + absl::Minutes(10),
                                      [&](MapWaitList::Outcome) {
                                        std::string bytes;
                                        SerializedAnswer(registry, &bytes);
                                        absl::MutexLock lock(&answered_mu);
                                        ++answered;
                                        last_answer = absl::Now();
                                      });
    if (!held) {
      std::fprintf(stderr, "control_plane_bench: long poll %d not held\n", i);
      return 1;
    }
  }
  std::vector<double> per_beat_us;
  for (int round = 0; round < rounds; ++round) {
    now += absl::Milliseconds(500);
    const absl::Time start = absl::Now();
    for (const HeartbeatRequest& beat : beats) {
      absl::StatusOr<HeartbeatResponse> answered = registry.Heartbeat(beat, now);
      if (!answered.ok()) {
        std::fprintf(stderr, "control_plane_bench: heartbeat of %s: %s\n", beat.node_name().c_str(),
                     answered.status().ToString().c_str());
        return 1;
      }
    }
    per_beat_us.push_back(absl::ToDoubleMicroseconds(absl::Now() - start) / beats.size());
  }
  // A worker's GetClusterView answer, serialized as gRPC sends it: as the service builds
  // it (the map's bytes made once per map, shared), and as a copy of the whole view.
  std::vector<double> answer_us, copied_answer_us;
  std::string wire;
  for (int round = 0; round < rounds; ++round) {
    absl::Time start = absl::Now();
    SerializedAnswer(registry, &wire);
    answer_us.push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
    start = absl::Now();
    view = registry.View();
    view.SerializeToString(&wire);
    copied_answer_us.push_back(absl::ToDoubleMicroseconds(absl::Now() - start));
  }
  const absl::Time start = absl::Now();
  absl::StatusOr<MapChange> change = registry.DeclareDead("ps-1");
  const double declare_ms = absl::ToDoubleMilliseconds(absl::Now() - start);
  if (!change.ok()) {
    std::fprintf(stderr, "control_plane_bench: declaring ps-1 dead: %s\n",
                 change.status().ToString().c_str());
    return 1;
  }
  const absl::Time published = start + absl::Milliseconds(declare_ms);
  double polls_answered_ms = -1;
  {
    absl::MutexLock lock(&answered_mu);
    auto all_answered = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(answered_mu) {
      return answered == workers;
    };
    if (answered_mu.AwaitWithTimeout(absl::Condition(&all_answered), absl::Seconds(60))) {
      polls_answered_ms = absl::ToDoubleMilliseconds(last_answer - published);
    }
  }
  registry.SetMapListener(nullptr);
  // map_bytes= is the view a node fetches before the loss; the fan-out is of the new map.
  const double new_map_bytes = static_cast<double>(change->map.ByteSizeLong());
  const double heartbeat_us = Median(per_beat_us);
  std::printf(
      "control_plane nodes=%d servers=%d workers=%d shards=%d heartbeat_us=%.2f "
      "heartbeat_core=%.4f answer_us=%.0f copied_answer_us=%.0f map_bytes=%.0f "
      "held_polls=%d declare_dead_ms=%.2f polls_answered_ms=%.1f "
      "map_publish_mb=%.1f registry_mb=%.1f\n",
      nodes, servers, workers, options.cluster.shards, heartbeat_us,
      heartbeat_us * 1e-6 * nodes * kHeartbeatsPerSecond, Median(answer_us),
      Median(copied_answer_us), static_cast<double>(view.ByteSizeLong()), workers, declare_ms,
      polls_answered_ms, new_map_bytes * (nodes - 1) / 1e6, ResidentMb() - rss_before);
  std::printf("  %s\n", change->summary.substr(0, 200).c_str());
  return 0;
}

}  // namespace
}  // namespace paramserver

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  for (absl::string_view text : absl::StrSplit(absl::GetFlag(FLAGS_nodes), ',')) {
    int nodes = 0;
    if (!absl::SimpleAtoi(text, &nodes) || nodes < 3) {
      std::fprintf(stderr, "control_plane_bench: --nodes: %s is not a size of 3 or more\n",
                   std::string(text).c_str());
      return 2;
    }
    if (int failed = paramserver::RunSize(nodes, std::max(1, absl::GetFlag(FLAGS_rounds)))) {
      return failed;
    }
  }
  return 0;
}
