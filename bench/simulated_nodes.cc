// Simulated nodes against a real ps_scheduler: `servers` + `workers` lightweight nodes in
// this one process, each a real gRPC client speaking the real protocol with real
// credentials (the cluster token, and the node token it registers with), the servers
// also serving InstallShardMap (on a port each) as a ps_server does. Driven by
// bench/run_all.py (scheduler_scale), which starts the scheduler.
//
//   simulated_nodes --scheduler=HOST:PORT --scheduler_pid=PID --cluster_token_file=F
//                   --servers=S --workers=W [--seconds=10]
//
// Registers every node, then heartbeats each every 500 ms (the default interval) for
// `seconds`, timing every call; then stops one server's heartbeats, as a server that
// died, and times the map the scheduler publishes without it: to every live server
// (its InstallShardMap) and to every worker (which learns the new epoch from a heartbeat
// answer and fetches the map, as a worker does). Prints one line of key=value figures:
//   heartbeat_p50_ms heartbeat_p99_ms   the calls' latency, seen by the nodes
//   scheduler_core                      the scheduler's CPU over the heartbeat window
//                                       (/proc: user + system), in cores
//   scheduler_rss_mb                    its resident memory at the end of the window
//   detect_ms                           the last heartbeat of the lost server to the
//                                       first install of the new map
//   servers_map_ms workers_map_ms       that first install to the last server's install
//                                       and to the last worker's fetch of the new map
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/rpc/scheduler_client.h"
#include "common/security/peer_credentials.h"
#include "grpcpp/grpcpp.h"
#include "proto/parameter_server.grpc.pb.h"

ABSL_FLAG(std::string, scheduler, "", "host:port of the scheduler");
ABSL_FLAG(int, scheduler_pid, 0, "its process id (for its CPU and memory)");
ABSL_FLAG(std::string, cluster_token_file, "", "the cluster token");
ABSL_FLAG(int, servers, 2, "simulated servers");
ABSL_FLAG(int, workers, 2, "simulated workers");
ABSL_FLAG(int, seconds, 10, "seconds of steady heartbeats");

namespace paramserver {
namespace {

constexpr absl::Duration kInterval = absl::Milliseconds(500);
constexpr int kHeartbeatThreads = 8;

// A ps_server's InstallShardMap, as far as the scheduler can tell: the time each epoch
// first reached each port.
class FakeServers final : public ParameterServer::Service {
 public:
  grpc::Status InstallShardMap(grpc::ServerContext* context, const InstallShardMapRequest* request,
                               InstallShardMapResponse* response) override {
    absl::MutexLock lock(&mu_);
    const int64_t epoch = request->shard_map().epoch();
    installs_[epoch].emplace(context->peer(), absl::Now());
    ++installs_per_epoch_[epoch];
    response->set_serving_epoch(epoch);
    return grpc::Status::OK;
  }
  // The first and last install of `epoch`, and how many there were.
  void Installs(int64_t epoch, absl::Time* first, absl::Time* last, int* count) {
    absl::MutexLock lock(&mu_);
    *count = installs_per_epoch_[epoch];
    *first = absl::InfiniteFuture();
    *last = absl::InfinitePast();
    for (const auto& [peer, at] : installs_[epoch]) {
      *first = std::min(*first, at);
      *last = std::max(*last, at);
    }
  }

 private:
  absl::Mutex mu_;
  std::map<int64_t, std::multimap<std::string, absl::Time>> installs_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, int> installs_per_epoch_ ABSL_GUARDED_BY(mu_);
};

struct Node {
  std::unique_ptr<SchedulerClient> client;
  std::string name;
  bool server = false;
  std::atomic<bool> silent{false};        // a server that "died"
  std::atomic<int64_t> known_epoch{0};    // the newest map this node has
  std::atomic<int64_t> fetched_at_ns{0};  // when a worker fetched the newest map
};

double CpuSeconds(int pid) {
  std::ifstream stat(absl::StrCat("/proc/", pid, "/stat"));
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const size_t close = text.rfind(')');
  if (close == std::string::npos) return 0;
  std::vector<std::string> fields = absl::StrSplit(text.substr(close + 2), ' ');
  if (fields.size() < 13) return 0;
  return (std::atof(fields[11].c_str()) + std::atof(fields[12].c_str())) / sysconf(_SC_CLK_TCK);
}

double ResidentMb(int pid) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atof(line.c_str() + 6) / 1024;
  }
  return 0;
}

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return values[std::min(values.size() - 1, static_cast<size_t>(p * values.size()))];
}

int Run() {
  const std::string scheduler = absl::GetFlag(FLAGS_scheduler);
  const int servers = absl::GetFlag(FLAGS_servers);
  const int workers = absl::GetFlag(FLAGS_workers);
  std::ifstream token_file(absl::GetFlag(FLAGS_cluster_token_file));
  std::string token((std::istreambuf_iterator<char>(token_file)), std::istreambuf_iterator<char>());
  token = std::string(absl::StripAsciiWhitespace(token));
  if (scheduler.empty() || token.empty() || servers < 2 || workers < 1) {
    std::fprintf(stderr,
                 "simulated_nodes: --scheduler, --cluster_token_file, --servers >= 2 and "
                 "--workers >= 1 are needed\n");
    return 2;
  }
  // One gRPC server, a port per simulated server.
  FakeServers fake;
  grpc::ServerBuilder builder;
  std::vector<int> ports(servers, 0);
  for (int s = 0; s < servers; ++s) {
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &ports[s]);
  }
  builder.RegisterService(&fake);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) {
    std::fprintf(stderr, "simulated_nodes: cannot serve %d ports\n", servers);
    return 1;
  }
  std::vector<std::unique_ptr<Node>> nodes;
  for (int i = 0; i < servers + workers; ++i) {
    auto node = std::make_unique<Node>();
    node->server = i < servers;
    node->client = std::make_unique<SchedulerClient>(scheduler, absl::Seconds(10),
                                                     std::make_shared<CallCredentials>(token));
    nodes.push_back(std::move(node));
  }
  // What each server holds under the first map (its heartbeat's shard statuses): set
  // once, before `map_known`.
  std::map<std::string, std::vector<ShardStatus>> held;
  std::atomic<bool> map_known{false};
  std::atomic<int> registered_nodes{0};
  std::atomic<int> failed_registrations{0};
  std::atomic<bool> stop{false};
  std::atomic<bool> timing{false};
  std::atomic<int> declared_dead{0};
  absl::Mutex latencies_mu;
  std::vector<double> latencies_ms;
  std::vector<std::thread> threads;
  for (int t = 0; t < kHeartbeatThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<double> mine;
      // Each thread registers its nodes, heartbeating those registered meanwhile (a node
      // silent for the failure timeout would be declared dead).
      for (size_t i = t; i < nodes.size(); i += kHeartbeatThreads) {
        Node& node = *nodes[i];
        const std::string address = node.server ? absl::StrCat("127.0.0.1:", ports[i])
                                                : absl::StrCat("127.0.0.1:", 20000 + i);
        absl::StatusOr<RegisterResponse> registered =
            node.client->Register(node.server ? NODE_ROLE_SERVER : NODE_ROLE_WORKER, address,
                                  absl::Now() + absl::Seconds(60));
        if (!registered.ok()) {
          std::fprintf(stderr, "simulated_nodes: registering node %zu: %s\n", i,
                       registered.status().ToString().c_str());
          ++failed_registrations;
          return;
        }
        node.name = registered->node_name();
        ++registered_nodes;
      }
      absl::Time next = absl::Now();
      while (!stop) {
        for (size_t i = t; i < nodes.size(); i += kHeartbeatThreads) {
          Node& node = *nodes[i];
          if (node.silent) continue;
          HeartbeatRequest request;
          request.set_node_name(node.name);
          if (node.server) {
            request.set_serving_epoch(node.known_epoch);
            if (map_known) {
              // find, not []: eight threads read this map; [] could insert.
              if (auto it = held.find(node.name); it != held.end()) {
                for (const ShardStatus& status : it->second) *request.add_shards() = status;
              }
            }
          } else {
            request.mutable_progress()->set_step(1);
          }
          const absl::Time start = absl::Now();
          absl::StatusOr<HeartbeatResponse> answer = node.client->Heartbeat(request);
          if (timing) mine.push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
          if (!answer.ok() && absl::IsFailedPrecondition(answer.status()) && !node.silent) {
            // Declared dead: the scheduler did not keep up with the heartbeats.
            node.silent = true;
            ++declared_dead;
          }
          if (!answer.ok() || answer->epoch() <= node.known_epoch) continue;
          if (node.server) {
            node.known_epoch = answer->epoch();  // installed through InstallShardMap
          } else {
            // A worker fetches the new map, as it does on a newer epoch.
            absl::StatusOr<ClusterView> view = node.client->GetClusterView(node.name);
            if (view.ok()) {
              node.known_epoch = view->shard_map().epoch();
              node.fetched_at_ns = absl::ToUnixNanos(absl::Now());
            }
          }
        }
        next += kInterval;
        absl::SleepFor(next - absl::Now());
      }
      absl::MutexLock lock(&latencies_mu);
      latencies_ms.insert(latencies_ms.end(), mine.begin(), mine.end());
    });
  }
  const absl::Time registering_until = absl::Now() + absl::Seconds(120);
  while (registered_nodes + failed_registrations < static_cast<int>(nodes.size()) &&
         absl::Now() < registering_until) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  absl::StatusOr<ClusterView> ready =
      registered_nodes == static_cast<int>(nodes.size())
          ? nodes.back()->client->WaitForReady(nodes.back()->name, absl::Now() + absl::Seconds(60))
          : absl::UnavailableError(
                absl::StrCat(registered_nodes.load(), " of ", nodes.size(), " nodes registered"));
  // The scheduler fell behind: nodes that kept heartbeating were declared dead.
  auto report_unsustained = [&](double scheduler_core, double rss) {
    stop = true;
    for (std::thread& thread : threads) thread.join();
    std::printf(
        "simulated nodes=%d servers=%d workers=%d sustained=0 declared_dead=%d "
        "heartbeat_p50_ms=%.3f heartbeat_p99_ms=%.3f scheduler_core=%.4f scheduler_rss_mb=%.1f\n",
        servers + workers, servers, workers, declared_dead.load(), Percentile(latencies_ms, 0.5),
        Percentile(latencies_ms, 0.99), scheduler_core, rss);
    return 0;
  };
  if (!ready.ok() && declared_dead > 0) {
    return report_unsustained(0, ResidentMb(absl::GetFlag(FLAGS_scheduler_pid)));
  }
  if (!ready.ok()) {
    std::fprintf(stderr, "simulated_nodes: %s\n", ready.status().ToString().c_str());
    stop = true;
    for (std::thread& thread : threads) thread.join();
    return 1;
  }
  for (const ShardAssignment& assignment : ready->shard_map().shards()) {
    ShardStatus status;
    status.set_shard_id(assignment.shard_id());
    status.set_checkpoint_step(-1);
    held[assignment.server_name()].push_back(status);
    status.set_backup(true);
    for (const ShardReplica& backup : assignment.backups())
      held[backup.server_name()].push_back(status);
  }
  const int64_t first_epoch = ready->shard_map().epoch();
  map_known = true;
  const int pid = absl::GetFlag(FLAGS_scheduler_pid);
  absl::SleepFor(absl::Seconds(3));  // settle: every node has the first map
  const double cpu_before = CpuSeconds(pid);
  const absl::Time window_start = absl::Now();
  timing = true;
  absl::SleepFor(absl::Seconds(absl::GetFlag(FLAGS_seconds)));
  timing = false;
  const double scheduler_core =
      (CpuSeconds(pid) - cpu_before) / absl::ToDoubleSeconds(absl::Now() - window_start);
  const double rss = ResidentMb(pid);

  if (declared_dead > 0) return report_unsustained(scheduler_core, rss);
  // ps-1 dies (its heartbeats stop).
  Node* lost = nullptr;
  for (auto& node : nodes) {
    if (node->name == "ps-1") lost = node.get();
  }
  if (lost == nullptr) {
    std::fprintf(stderr, "simulated_nodes: no node is ps-1\n");
    return 1;
  }
  lost->silent = true;
  const absl::Time silent_since = absl::Now();
  const int64_t new_epoch = first_epoch + 1;
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  absl::Time first = absl::InfiniteFuture(), last = absl::InfinitePast();
  int installs = 0;
  auto every_worker_has_it = [&] {
    for (auto& node : nodes) {
      if (!node->server && node->known_epoch < new_epoch) return false;
    }
    return true;
  };
  while (absl::Now() < give_up) {
    fake.Installs(new_epoch, &first, &last, &installs);
    if (installs >= servers - 1 && every_worker_has_it()) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  stop = true;
  for (std::thread& thread : threads) thread.join();
  if (installs < servers - 1 || !every_worker_has_it()) {
    std::fprintf(stderr, "simulated_nodes: epoch %lld reached %d of %d live servers in 60 s\n",
                 static_cast<long long>(new_epoch), installs, servers - 1);
    return 1;
  }
  int64_t last_fetch_ns = 0;
  for (auto& node : nodes) {
    if (!node->server) last_fetch_ns = std::max<int64_t>(last_fetch_ns, node->fetched_at_ns);
  }
  std::printf(
      "simulated nodes=%d servers=%d workers=%d sustained=1 heartbeats=%zu heartbeat_p50_ms=%.3f "
      "heartbeat_p99_ms=%.3f scheduler_core=%.4f scheduler_rss_mb=%.1f detect_ms=%.0f "
      "servers_map_ms=%.1f workers_map_ms=%.1f\n",
      servers + workers, servers, workers, latencies_ms.size(), Percentile(latencies_ms, 0.5),
      Percentile(latencies_ms, 0.99), scheduler_core, rss,
      absl::ToDoubleMilliseconds(first - silent_since), absl::ToDoubleMilliseconds(last - first),
      absl::ToDoubleMilliseconds(absl::FromUnixNanos(last_fetch_ns) - first));
  server->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
  return 0;
}

}  // namespace
}  // namespace paramserver

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return paramserver::Run();
}
