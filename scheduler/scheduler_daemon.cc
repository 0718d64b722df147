#include "scheduler/scheduler_daemon.h"

#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/mlp_parameters.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"

namespace paramserver {

absl::StatusOr<std::unique_ptr<SchedulerDaemon>> SchedulerDaemon::Create(SchedulerDaemonOptions options) {
  if (options.listen_address.empty()) options.listen_address = options.spec.cluster.scheduler_address;
  const int64_t total = MlpLayout(options.spec.model.layers).total_parameters();
  if (options.spec.cluster.shards > total) {
    return absl::InvalidArgumentError(absl::StrCat("cluster.shards (", options.spec.cluster.shards,
                                                   ") exceeds the model's ", total, " parameters"));
  }
  std::unique_ptr<SchedulerDaemon> daemon(new SchedulerDaemon(std::move(options)));
  PS_ASSIGN_OR_RETURN(daemon->rpc_, StartRpcServer(daemon->options_.listen_address, {&daemon->service_}));
  if (!daemon->options_.port_file.empty()) {
    const std::string temporary = daemon->options_.port_file + ".tmp";
    std::ofstream(temporary) << daemon->rpc_.port << "\n";
    if (std::rename(temporary.c_str(), daemon->options_.port_file.c_str()) != 0) {
      return absl::UnavailableError(absl::StrCat("cannot write the port file ", daemon->options_.port_file));
    }
  }
  const ClusterSection& cluster = daemon->options_.spec.cluster;
  spdlog::info("serving on port {}; waiting for {} servers and {} workers; mode {}", daemon->rpc_.port,
               cluster.servers, cluster.workers, std::string(TrainingModeName(daemon->options_.spec.training.mode)));
  return daemon;
}

SchedulerDaemon::SchedulerDaemon(SchedulerDaemonOptions options)
    : options_(std::move(options)),
      registry_(options_.spec.cluster, MlpLayout(options_.spec.model.layers).total_parameters()),
      service_(&registry_, [this](const JobResult& result) { OnResult(result); }) {}

SchedulerDaemon::~SchedulerDaemon() {
  if (rpc_.server != nullptr) rpc_.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
}

void SchedulerDaemon::OnResult(const JobResult& result) {
  spdlog::info("final test_accuracy={:.4f} samples_per_sec={:.0f} steps={}", result.test_accuracy,
               result.samples_per_sec, result.steps);
  absl::MutexLock lock(&mu_);
  finished_at_ = absl::Now();
}

absl::Status SchedulerDaemon::Run() {
  const absl::Duration failure_timeout = absl::Milliseconds(options_.spec.cluster.failure_timeout_ms);
  const absl::Duration check_interval = absl::Milliseconds(options_.spec.cluster.heartbeat_interval_ms) / 2;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stop_requested_), check_interval)) return absl::OkStatus();
      if (finished_at_.has_value() &&
          (registry_.all_servers_told_to_stop() || absl::Now() - *finished_at_ > failure_timeout)) {
        spdlog::info("job finished; every server has been told to stop");
        return absl::OkStatus();
      }
    }
    for (const SilentNode& node : registry_.TakeNewlySilentNodes(absl::Now(), failure_timeout)) {
      spdlog::warn("{} has sent no heartbeat for {} ms (failure timeout {} ms): it is presumed dead", node.name,
                   absl::ToInt64Milliseconds(node.silent_for), options_.spec.cluster.failure_timeout_ms);
    }
  }
}

void SchedulerDaemon::Shutdown() {
  absl::MutexLock lock(&mu_);
  stop_requested_ = true;
}

}  // namespace paramserver
