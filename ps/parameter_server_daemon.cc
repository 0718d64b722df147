#include "ps/parameter_server_daemon.h"

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/mlp_parameters.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"

namespace paramserver {

absl::StatusOr<std::unique_ptr<ParameterServerDaemon>> ParameterServerDaemon::Create(
    ParameterServerDaemonOptions options) {
  if (options.scheduler_address.empty()) options.scheduler_address = options.spec.cluster.scheduler_address;
  MlpLayout layout(options.spec.model.layers);
  std::vector<float> initial;
  if (options.spec.model.init_from.empty()) {
    initial = InitializeMlpParameters(layout, options.spec.model.init_seed);
  } else {
    PS_ASSIGN_OR_RETURN(initial, LoadMlpParameters(layout, options.spec.model.init_from));
  }
  std::unique_ptr<ParameterServerDaemon> daemon(
      new ParameterServerDaemon(std::move(options), std::move(initial)));
  PS_RETURN_IF_ERROR(daemon->Start());
  return daemon;
}

ParameterServerDaemon::ParameterServerDaemon(ParameterServerDaemonOptions options,
                                             std::vector<float> initial_parameters)
    : options_(std::move(options)), initial_parameters_(std::move(initial_parameters)) {}

ParameterServerDaemon::~ParameterServerDaemon() {
  heartbeats_.reset();
  if (service_ != nullptr) service_->CloseShards();
  if (rpc_.server != nullptr) rpc_.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
}

absl::Status ParameterServerDaemon::Start() {
  const ClusterSpec& spec = options_.spec;
  // A pull waits at most this long for the step it asks for (sync, ssp).
  service_ = std::make_unique<ParameterServerServiceImpl>(absl::Seconds(60));
  PS_ASSIGN_OR_RETURN(rpc_, StartRpcServer(options_.listen_address, {service_.get()}));
  const std::string advertised = options_.advertise_address.empty()
                                     ? WithBoundPort(options_.listen_address, rpc_.port)
                                     : options_.advertise_address;
  const absl::Duration rpc_timeout = absl::Milliseconds(spec.cluster.failure_timeout_ms);
  scheduler_ = std::make_unique<SchedulerClient>(options_.scheduler_address, rpc_timeout);
  const absl::Time deadline = absl::Now() + options_.startup_timeout;
  PS_ASSIGN_OR_RETURN(RegisterResponse registered,
                      scheduler_->Register(NODE_ROLE_SERVER, advertised, deadline));
  node_name_ = registered.node_name();
  SetLogNodeName(node_name_);
  spdlog::info("registered with the scheduler at {}; serving on {}", options_.scheduler_address,
               advertised);
  PS_ASSIGN_OR_RETURN(ClusterView view, scheduler_->WaitForReady(node_name_, deadline));

  std::map<int, std::shared_ptr<ParameterShard>> shards;
  int64_t parameters = 0;
  for (const ShardAssignment& assignment : view.shard_map().shards()) {
    if (assignment.server_name() != node_name_) continue;
    if (assignment.begin() < 0 || assignment.end() > static_cast<int64_t>(initial_parameters_.size()) ||
        assignment.begin() >= assignment.end()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the scheduler assigned shard ", assignment.shard_id(), " = [", assignment.begin(), ", ",
          assignment.end(), "), outside this model's ", initial_parameters_.size(),
          " parameters: do the scheduler and this server use the same config?"));
    }
    ParameterShardOptions shard_options;
    shard_options.shard_id = assignment.shard_id();
    shard_options.range = {assignment.begin(), assignment.end()};
    shard_options.mode = spec.training.mode;
    shard_options.num_workers = view.expected_workers();
    shard_options.staleness = spec.training.staleness;
    shard_options.adam = spec.training.optimizer;
    std::vector<float> values(initial_parameters_.begin() + assignment.begin(),
                              initial_parameters_.begin() + assignment.end());
    shards[assignment.shard_id()] = std::make_shared<ParameterShard>(shard_options, std::move(values));
    parameters += assignment.end() - assignment.begin();
  }
  spdlog::info("holding {} shard(s), {} parameters, at epoch {}; mode {}", shards.size(), parameters,
               view.shard_map().epoch(), std::string(TrainingModeName(spec.training.mode)));
  service_->InstallShards(node_name_, view.shard_map().epoch(), std::move(shards));

  heartbeats_ = std::make_unique<HeartbeatSender>(
      scheduler_.get(), node_name_, absl::Milliseconds(spec.cluster.heartbeat_interval_ms),
      [] { return NodeProgress(); },
      [this](const HeartbeatResponse& response) {
        if (response.job_finished()) {
          spdlog::info("the scheduler reports the job finished; shutting down");
          Shutdown();
        }
      });
  return absl::OkStatus();
}

absl::Status ParameterServerDaemon::Run() {
  absl::MutexLock lock(&mu_);
  while (!mu_.AwaitWithTimeout(absl::Condition(&stop_requested_), absl::Seconds(60))) {
  }
  return absl::OkStatus();
}

void ParameterServerDaemon::Shutdown() {
  absl::MutexLock lock(&mu_);
  stop_requested_ = true;
}

}  // namespace paramserver
