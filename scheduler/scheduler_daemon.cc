#include "scheduler/scheduler_daemon.h"

#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/checkpoint/shard_checkpoint.h"
#include "common/config/storage_checks.h"
#include "common/files/file_system.h"
#include "common/files/s3_file_system.h"
#include "common/model/mlp_parameters.h"
#include "common/model/model_declaration.h"
#include "common/model/optimizer_groups.h"
#include "common/ops/daemon_main.h"
#include "common/ops/plain_json.h"
#include "common/ops/process_memory.h"
#include "common/security/admin_token.h"
#include "common/security/security_policy.h"
#include "common/security/shard_map_signature.h"
#include "scheduler/cluster_status.h"
#include "scheduler/map_publisher.h"
#include "scheduler/resumed_model.h"
#include "scheduler/scheduler_metrics.h"
#include "scheduler/status_page.h"
#include "spdlog/spdlog.h"

namespace paramserver {

absl::Status CheckSpecModel(const ClusterSpec& spec) {
  // A torch model's layout is declared by its first worker (ClusterRegistry::DeclareModel
  // checks it then).
  if (spec.model.type == ModelType::kTorch) return absl::OkStatus();
  PS_ASSIGN_OR_RETURN(ModelLayout layout, ModelLayoutFromSpec(spec.model));
  const int64_t total = layout.dense_parameters();
  if (spec.cluster.shards > total) {
    return absl::InvalidArgumentError(absl::StrCat("cluster.shards (", spec.cluster.shards,
                                                   ") exceeds the model's ", total, " parameters"));
  }
  return OptimizerSegments(spec.training.optimizer, layout).status();
}

namespace {

// The newest step at which every shard of `model` has a verified checkpoint in `dir`
// (-1: none). Servers may be renaming or pruning files while we look: look again
// before giving up.
// `tables`: the embedding tables a complete cut holds (0 for a hybrid job, whose tables
// are checkpointed at their own update counts).
int64_t NewestCompleteCheckpoint(const std::string& dir, const ModelLayout& model, int tables) {
  int64_t step = -1;
  for (int attempt = 0; attempt < 5 && step < 0; ++attempt) {
    if (attempt > 0) absl::SleepFor(absl::Milliseconds(20));
    step = NewestCompleteCheckpointStep(FileSystemFor(dir), dir, model.dense_parameters(), tables);
  }
  return step;
}

// The tables a complete checkpoint cut of `model` holds: all of them, but none for a
// hybrid job (training.embedding_mode async).
int TablesInCut(const TrainingSection& training, const ModelLayout& model) {
  return training.async_tables ? 0 : static_cast<int>(model.embedding_tables().size());
}

// What the registry is made with, from the spec: the model, the mode, the checkpoints
// (and the step checkpoint.resume resumes at). The spec's errors that only the
// scheduler can see (too many shards, a resume without a checkpoint).
absl::StatusOr<RegistryOptions> RegistryOptionsFor(const ClusterSpec& spec) {
  const bool torch = spec.model.type == ModelType::kTorch;
  // A torch model's layout is declared by its first worker (ClusterRegistry::DeclareModel).
  ModelLayout layout;
  PS_RETURN_IF_ERROR(CheckSpecModel(spec));
  if (!torch) {
    PS_ASSIGN_OR_RETURN(layout, ModelLayoutFromSpec(spec.model));
  }
  RegistryOptions options;
  // A torch model is declared by its first worker; one resuming is the model its
  // checkpoints recorded (resumed_model.h), read now to find the step to resume at.
  ModelLayout checkpointed = layout;
  if (torch && spec.checkpoint.resume) {
    absl::StatusOr<ModelDeclaration> saved = LoadModelDeclaration(spec.checkpoint.dir);
    if (!saved.ok()) {
      return absl::Status(saved.status().code(),
                          absl::StrCat("checkpoint.resume: ", saved.status().message()));
    }
    PS_ASSIGN_OR_RETURN(checkpointed, LayoutOfDeclaration(*saved));
    options.resumed_model = *std::move(saved);
  }
  if (torch && !spec.checkpoint.dir.empty()) {
    options.on_model_declared = [dir = spec.checkpoint.dir](const ModelDeclaration& model) {
      const absl::Status saved = SaveModelDeclaration(dir, model);
      if (!saved.ok()) {
        spdlog::error(
            "the model could not be recorded beside the checkpoints, so a later "
            "job cannot resume from them: {}",
            saved.ToString());
      }
    };
  }
  options.cluster = spec.cluster;
  options.mode = spec.training.mode;
  options.async_tables = spec.training.async_tables;
  options.layout = std::move(layout);
  options.optimizer = spec.training.optimizer;
  options.model_declared_by_workers = torch;
  options.model_init_from = !spec.model.init_from.empty();
  options.ctr = spec.model.type == ModelType::kCtr;
  options.checkpoints = !spec.checkpoint.dir.empty();
  options.epochs = spec.training.epochs;
  options.batch_size = torch ? 0 : spec.training.batch_size;
  options.chunk_batches = spec.data.chunk_batches;
  options.newest_complete_checkpoint = [dir = spec.checkpoint.dir,
                                        training = spec.training](const ModelLayout& model) {
    return NewestCompleteCheckpoint(dir, model, TablesInCut(training, model));
  };
  if (spec.checkpoint.resume) {
    const int64_t total = checkpointed.dense_parameters();
    const int tables = TablesInCut(spec.training, checkpointed);
    FileSystem& fs = FileSystemFor(spec.checkpoint.dir);
    options.resume_step = NewestCompleteCheckpointStep(fs, spec.checkpoint.dir, total, tables);
    if (options.resume_step < 0) {
      return absl::NotFoundError(
          absl::StrCat("checkpoint.resume is set but ", spec.checkpoint.dir,
                       " holds no complete checkpoint of this model's ", total, " parameters",
                       tables > 0 ? absl::StrCat(" and ", tables, " embedding tables") : "", ": ",
                       DescribeWhyNoCompleteCheckpoint(fs, spec.checkpoint.dir, total, tables)));
    }
    spdlog::info("resuming from the checkpoint at step {} in {}", options.resume_step,
                 spec.checkpoint.dir);
  }
  PS_ASSIGN_OR_RETURN(options.map_signing_key, MapSigningKey::Generate());
  return options;
}

// Writes `port` into `path` (if set), atomically.
absl::Status WritePortFile(const std::string& path, int port) {
  if (path.empty()) return absl::OkStatus();
  const absl::Status written =
      WriteFileAtomically(LocalFileSystem(), path, absl::StrCat(port, "\n"));
  if (written.ok()) return written;
  return absl::UnavailableError(
      absl::StrCat("cannot write the port file ", path, ": ", written.message()));
}

}  // namespace

absl::StatusOr<std::unique_ptr<SchedulerDaemon>> SchedulerDaemon::Create(
    SchedulerDaemonOptions options) {
  if (options.listen_address.empty())
    options.listen_address = options.spec.cluster.scheduler_address;
  const ClusterSpec& spec = options.spec;
  PS_RETURN_IF_ERROR(CheckSpecStorage(spec, StorageUser::kScheduler));
  PS_ASSIGN_OR_RETURN(RegistryOptions registry_options, RegistryOptionsFor(spec));
  std::string admin_token;
  if (!spec.security.admin_token_file.empty()) {
    PS_ASSIGN_OR_RETURN(admin_token, ReadAdminToken(spec.security.admin_token_file));
  }
  PS_ASSIGN_OR_RETURN(std::string cluster_token, ReadClusterToken(spec.security));
  PS_RETURN_IF_ERROR(CheckListenAddressIsSafe(options.listen_address, spec.security));
  std::unique_ptr<SchedulerDaemon> daemon(new SchedulerDaemon(
      std::move(options), registry_options, std::move(cluster_token), std::move(admin_token)));
  PS_RETURN_IF_ERROR(daemon->TakeOverSavedState());
  PS_ASSIGN_OR_RETURN(daemon->rpc_, StartRpcServer(daemon->options_.listen_address,
                                                   {&daemon->service_, &daemon->admin_},
                                                   kMaxSchedulerMessageBytes));
  PS_RETURN_IF_ERROR(daemon->ServeStatusAndMetrics());
  PS_RETURN_IF_ERROR(WritePortFile(daemon->options_.port_file, daemon->rpc_.port));
  const ClusterSection& cluster = daemon->options_.spec.cluster;
  spdlog::info("serving on port {}; waiting for {} servers and {} workers; mode {}",
               daemon->rpc_.port, cluster.servers, cluster.workers,
               TrainingModesText(daemon->options_.spec.training));
  return daemon;
}

absl::Status SchedulerDaemon::TakeOverSavedState() {
  const std::string& path = options_.state_file;
  if (path.empty()) return absl::OkStatus();
  absl::StatusOr<std::string> saved = LocalFileSystem().ReadFile(path);
  if (absl::IsNotFound(saved.status())) return absl::OkStatus();  // a new job
  if (!saved.ok()) {
    return absl::UnavailableError(
        absl::StrCat("cannot read the scheduler state: ", saved.status().message()));
  }
  SchedulerState state;
  if (!state.ParseFromString(*saved)) {
    return absl::DataLossError(absl::StrCat(path, ": not a scheduler state file"));
  }
  const absl::Status imported = registry_.ImportState(state, absl::Now());
  if (!imported.ok()) {
    return absl::DataLossError(
        absl::StrCat(path, ": not a state of this job: ", imported.message()));
  }
  if (registry_.job_finished()) {
    // Its predecessor had ended the job and was telling the nodes so: this one goes on
    // telling them, and ends as it would have (exit 3 for a job ended unfinished).
    const absl::Status ended = registry_.ended_unfinished();
    spdlog::warn("took over from {} a job that had ended ({}): telling every node to stop", path,
                 ended.ok() ? (state.has_result() ? std::string("finished")
                                                  : std::string("shut down by an operator"))
                            : absl::StrCat("unfinished: ", ended.message()));
    const std::optional<JobResult> result = registry_.TakeSnapshot(/*with_history=*/false).result;
    if (result.has_value()) {
      OnResult(*result);  // its final line again, for whoever reads this log
    } else {
      OnShutdownRequested();
    }
    return absl::OkStatus();
  }
  // This process's credential and map key are its own (neither is in the state): the
  // servers learn them from their next heartbeat reply.
  spdlog::info("took over the running job from {}: {} nodes, shard map epoch {}", path,
               state.nodes_size(), state.shard_map().epoch());
  return absl::OkStatus();
}

absl::Status SchedulerDaemon::ServeStatusAndMetrics() {
  AddProcessMemoryMetrics(&metrics_);
  metrics_.AddScrapedFamilies([this] {
    return SchedulerMetricFamilies(
        DescribeCluster(registry_.TakeSnapshot(/*with_history=*/false), absl::Now()));
  });
  std::vector<HttpRoute> pages;
  HttpRoute api{"/api/status", "application/json", [this] {
                  return StatusJson(
                      DescribeCluster(registry_.TakeSnapshot(/*with_history=*/true), absl::Now()));
                }};
  if (options_.spec.security.admin_reads_need_token) {
    // The page cannot send the token; the API is answered to those who do.
    api.authorize = [token = admin_token_](const std::string& authorization) {
      return BearerMatches(authorization, token);
    };
  } else {
    pages.push_back({"/", "text/html; charset=utf-8", [] { return StatusPageHtml(); }});
  }
  pages.push_back(std::move(api));
  PS_ASSIGN_OR_RETURN(metrics_http_, MaybeServeMetrics(options_.metrics_port, options_.metrics_host,
                                                       &metrics_, std::move(pages),
                                                       HttpsFiles{options_.spec.security.tls_cert,
                                                                  options_.spec.security.tls_key}));
  return absl::OkStatus();
}

SchedulerDaemon::SchedulerDaemon(SchedulerDaemonOptions options, RegistryOptions registry_options,
                                 std::string cluster_token, std::string admin_token)
    : options_(std::move(options)),
      admin_token_(admin_token),
      registry_(std::move(registry_options)),
      credentials_(std::make_shared<CallCredentials>(cluster_token)),
      service_(
          &registry_, cluster_token, &refusals_,
          [this](const JobResult& result) { OnResult(result); },
          [this](MapChange change) {
            spdlog::info("epoch {}: {}", change.map.epoch(), change.summary);
            EnqueueMapChange(std::move(change));
          },
          [this] { return MaybeSaveState(); }),
      admin_(&registry_, cluster_token, std::move(admin_token),
             options_.spec.security.admin_reads_need_token,
             AdminActions{[this] { return RequestCheckpoint(); },
                          [this](MapChange change) {
                            spdlog::info("epoch {}: {}", change.map.epoch(), change.summary);
                            EnqueueMapChange(std::move(change));
                          },
                          [this] { OnShutdownRequested(); }},
             &refusals_),
      publisher_([this] { PublishLoop(); }) {
  credentials_->SetIdentity(kSchedulerNodeName, registry_.scheduler_token());
}

SchedulerDaemon::~SchedulerDaemon() {
  Shutdown();
  publisher_.join();
  if (timed_checkpoint_.joinable()) timed_checkpoint_.join();
  // The server's shutdown waits for every call: the held long polls are answered first.
  service_.AnswerMapWaitsNow();
  if (rpc_.server != nullptr)
    rpc_.server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
}

absl::Status SchedulerDaemon::MaybeSaveState() {
  if (options_.state_file.empty()) return absl::OkStatus();
  absl::MutexLock lock(&save_mu_);
  const int64_t version = registry_.state_version();
  if (version == saved_state_version_) return absl::OkStatus();
  // It holds no credential (digests only), but says who is in the job: this user's only.
  const absl::Status written =
      WriteFileAtomically(LocalFileSystem(), options_.state_file,
                          registry_.ExportState().SerializeAsString(), FileAccess::kOwnerOnly);
  if (!written.ok()) {
    spdlog::error("cannot write the scheduler state: {}", written.ToString());
    return written;
  }
  saved_state_version_ = version;
  return absl::OkStatus();
}

void SchedulerDaemon::OnResult(const JobResult& result) {
  if (result.worker_processes > 0) {
    spdlog::info(
        "the workers trained {} samples in {} process(es), restarted and replaced ones "
        "included",
        result.samples, result.worker_processes);
  }
  if (result.without_score) {
    spdlog::info("final samples_per_sec={:.0f} steps={} (the script reported no test accuracy)",
                 result.samples_per_sec, result.steps);
  } else if (result.ctr) {
    spdlog::info("final test_auc={:.4f} test_logloss={:.4f} samples_per_sec={:.0f} steps={}",
                 result.test_auc, result.test_logloss, result.samples_per_sec, result.steps);
  } else {
    spdlog::info("final test_accuracy={:.4f} samples_per_sec={:.0f} steps={}", result.test_accuracy,
                 result.samples_per_sec, result.steps);
  }
  absl::MutexLock lock(&mu_);
  finished_at_ = absl::Now();
}

void SchedulerDaemon::WriteFinalReport() {
  const std::string& path = options_.spec.output.report;
  if (path.empty()) return;
  const ClusterStatus status =
      DescribeCluster(registry_.TakeSnapshot(/*with_history=*/true), absl::Now());
  const absl::Status written =
      WriteFileAtomically(FileSystemFor(path), path, FinalReportHtml(status));
  if (written.ok()) {
    spdlog::info("final report (the status page as the job ended) in {}", path);
  } else {
    spdlog::error("cannot write the final report (output.report) to {}: {}", path,
                  written.ToString());
  }
}

void SchedulerDaemon::OnShutdownRequested() {
  absl::MutexLock lock(&mu_);
  if (!finished_at_.has_value()) finished_at_ = absl::Now();
}

void SchedulerDaemon::EnqueueMapChange(MapChange change) {
  absl::MutexLock lock(&mu_);
  pending_changes_.push_back(std::move(change));
}

void SchedulerDaemon::PublishLoop() {
  const absl::Duration timeout =
      absl::Milliseconds(options_.spec.cluster.failure_timeout_ms) + absl::Seconds(10);
  while (true) {
    MapChange change;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stop_requested_ || !pending_changes_.empty();
      };
      mu_.AwaitWithTimeout(absl::Condition(&ready), absl::Seconds(1));
      if (stop_requested_) return;
      if (pending_changes_.empty()) continue;
      change = std::move(pending_changes_.front());
      pending_changes_.pop_front();
    }
    MaybeSaveState().IgnoreError();  // logged; the next tick tries again
    const absl::Time start = absl::Now();
    const int confirmed = PublishShardMap(change, server_stubs_, timeout);
    spdlog::info("epoch {} installed on {} of {} live servers in {} ms", change.map.epoch(),
                 confirmed, change.servers_first.size() + change.servers_then.size(),
                 absl::ToInt64Milliseconds(absl::Now() - start));
  }
}

absl::StatusOr<int64_t> SchedulerDaemon::RequestCheckpoint() {
  // Aim a little ahead of the shards; if some already passed the step, aim further.
  // The heartbeats' update counts lag (most at the start of a job, when the rate is not
  // known yet): a retry also aims beyond the furthest count the servers answered with.
  absl::Duration lead = absl::Milliseconds(options_.spec.cluster.heartbeat_interval_ms) * 2;
  int64_t newest_seen = 0;
  for (int attempt = 0; attempt < 6; ++attempt, lead *= 2) {  // lead up to 32 heartbeats
    absl::StatusOr<std::pair<int64_t, std::vector<std::string>>> plan =
        registry_.PlanCheckpoint(absl::Now(), lead);
    if (!plan.ok()) return plan.status();
    const int64_t step =
        attempt == 0 ? plan->first : std::max(plan->first, newest_seen + (int64_t{16} << attempt));
    absl::StatusOr<CheckpointScheduling> scheduled =
        ScheduleCheckpointOnServers(plan->second, server_stubs_, step, absl::Seconds(2));
    if (!scheduled.ok()) return scheduled.status();
    if (scheduled->passed_shards == 0) {
      spdlog::info("checkpoint requested: every shard writes one at step {}", step);
      return step;
    }
    newest_seen = std::max(newest_seen, scheduled->newest_applied_updates);
  }
  return absl::UnavailableError(
      "the shards kept passing the checkpoint step chosen for them; try again");
}

absl::Status SchedulerDaemon::Run() {
  const absl::Duration failure_timeout =
      absl::Milliseconds(options_.spec.cluster.failure_timeout_ms);
  const absl::Duration check_interval = std::min(
      absl::Milliseconds(100), absl::Milliseconds(options_.spec.cluster.heartbeat_interval_ms) / 2);
  const double every_seconds = options_.spec.checkpoint.every_seconds;
  absl::Time next_timed_checkpoint = absl::Now() + absl::Seconds(every_seconds);
  const int64_t no_worker_timeout_ms = options_.spec.cluster.no_worker_timeout_ms;
  WorkerAbsenceWatch absence_watch(no_worker_timeout_ms > 0
                                       ? absl::Milliseconds(no_worker_timeout_ms)
                                       : absl::InfiniteDuration(),
                                   absl::Seconds(5));
  // Why the job ended unfinished, if it did (here, or before a takeover).
  absl::Status ending = registry_.ended_unfinished();
  if (!ending.ok()) ending = MarkJobEndedUnfinished(std::move(ending));
  // A loop that did not run for this long was stopped or starved of CPU: it heard nobody
  // meanwhile, and that time must not count as the nodes' silence (on resuming it would
  // declare them all dead at once). The loop's own slow calls (the state file's fsync,
  // waiting for the last timed checkpoint) are not a pause: heartbeats kept arriving, and
  // excusing that time would only delay finding a node that did die.
  const absl::Duration pause_threshold = std::max(absl::Seconds(1), 10 * check_interval);
  absl::Time last_check = absl::Now();
  while (true) {
    absl::Duration blocked = absl::ZeroDuration();  // in this iteration's slow calls
    const absl::Time save_started = absl::Now();
    MaybeSaveState().IgnoreError();  // logged; the next tick tries again
    blocked += absl::Now() - save_started;
    // The counts only: a copy of the whole map ten times a second would cost 1.1 ms each
    // at 2,000 nodes (bench/control_plane_bench), under the registry's lock.
    const ClusterView view = registry_.ViewWithoutMap(nullptr);
    const bool job_ended = registry_.job_finished();  // a result, or a shutdown requested
    if (every_seconds > 0 && absl::Now() >= next_timed_checkpoint && view.ready() && !job_ended) {
      next_timed_checkpoint = absl::Now() + absl::Seconds(every_seconds);
      if (timed_checkpoint_.joinable()) {
        const absl::Time join_started = absl::Now();
        timed_checkpoint_.join();
        blocked += absl::Now() - join_started;
      }
      timed_checkpoint_ = std::thread([this] {
        absl::StatusOr<int64_t> step = RequestCheckpoint();
        if (!step.ok())
          spdlog::warn("time-based checkpoint not taken: {}", step.status().ToString());
      });
    }
    bool every_node_told = false;
    bool waited_long_enough = false;
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stop_requested_), check_interval))
        return absl::OkStatus();
      if (finished_at_.has_value()) {
        every_node_told = registry_.all_servers_told_to_stop();
        waited_long_enough = absl::Now() - *finished_at_ > failure_timeout;
      }
    }
    if (every_node_told || waited_long_enough) {
      const char* how = ending.ok() ? "finished" : "ended unfinished";
      if (every_node_told) {
        spdlog::info("job {}; every node has been told to stop", how);
      } else {
        // A node that has not heartbeated since (nor, a finished worker, been answered
        // a view that says so): it may be stopped or cut off, not yet declared dead.
        spdlog::warn("job {}; not every node has heard it after the failure timeout ({} ms)", how,
                     absl::ToInt64Milliseconds(failure_timeout));
      }
      WriteFinalReport();
      if (!options_.state_file.empty())
        LocalFileSystem().DeleteFile(options_.state_file).IgnoreError();  // nothing to take over
      return ending;
    }
    const bool job_started = view.ready() || view.registered_workers() > 0;
    MaybeEndWithoutWorkers(
        absence_watch.Observe(job_started, view.live_workers(), job_ended, absl::Now()), &ending);
    const absl::Time now = absl::Now();
    if (const absl::Duration gap = now - last_check - blocked; gap > pause_threshold) {
      registry_.ExcludeSchedulerPause(gap - check_interval, now);
      spdlog::warn(
          "the scheduler did not run for {} ms (stopped, or starved of CPU): that time does not "
          "count against any node's heartbeats",
          absl::ToInt64Milliseconds(gap));
    }
    last_check = now;
    for (const SilentNode& node : registry_.SilentNodes(now, failure_timeout)) {
      spdlog::warn("{} has sent no heartbeat for {} ms (failure timeout {} ms): declared dead",
                   node.name, absl::ToInt64Milliseconds(node.silent_for),
                   options_.spec.cluster.failure_timeout_ms);
      absl::StatusOr<MapChange> change = registry_.DeclareDead(node.name, now);
      if (!change.ok()) {
        spdlog::error("cannot recover from the loss of {}: {}", node.name,
                      change.status().ToString());
        if (change.status().code() == absl::StatusCode::kDataLoss && !job_ended && ending.ok()) {
          // A shard's only state is gone: no step can complete, and waiting would only
          // hold every worker until it gave up. The job ends now, saying why. (After
          // the result or a shutdown the job has ended already, as it meant to.)
          EndJobUnfinished(
              absl::DataLossError(absl::StrCat("lost ", node.name, ": ", change.status().message(),
                                               "; the job cannot go on")),
              &ending);
          break;
        }
        continue;
      }
      spdlog::info("epoch {}: {}", change->map.epoch(), change->summary);
      EnqueueMapChange(*std::move(change));
    }
    if (std::optional<MapChange> balanced = registry_.BalancePrimaries(absl::Now());
        balanced.has_value()) {
      spdlog::info("epoch {}: {}", balanced->map.epoch(), balanced->summary);
      EnqueueMapChange(*std::move(balanced));
    }
  }
}

void SchedulerDaemon::MaybeEndWithoutWorkers(const WorkerAbsenceWatch::Observation& absence,
                                             absl::Status* ending) {
  const int64_t limit_ms = options_.spec.cluster.no_worker_timeout_ms;
  const std::string limit = limit_ms > 0 ? absl::StrCat(limit_ms / 1000.0, " s") : "no limit";
  if (absence.verdict == WorkerAbsenceWatch::Verdict::kWaiting) {
    spdlog::warn(
        "no worker is alive: the job waits for one to join ({} s so far; it gives up at {}, "
        "cluster.no_worker_timeout_ms)",
        absl::ToInt64Seconds(absence.waited), limit);
  } else if (absence.verdict == WorkerAbsenceWatch::Verdict::kGiveUp) {
    EndJobUnfinished(absl::DeadlineExceededError(absl::StrCat(
                         "no worker joined within ", limit,
                         " (cluster.no_worker_timeout_ms) after the last one was lost: the "
                         "job cannot finish")),
                     ending);
  }
}

void SchedulerDaemon::EndJobUnfinished(absl::Status why, absl::Status* ending) {
  // Kept in the state, for a scheduler taking over. A job that has just ended otherwise
  // (its result came in first) keeps that ending.
  if (!registry_.EndJobUnfinished(why)) return;
  *ending = MarkJobEndedUnfinished(std::move(why));
  spdlog::error("{}; telling every node to stop", std::string(ending->message()));
  OnShutdownRequested();
}

void SchedulerDaemon::Shutdown() {
  absl::MutexLock lock(&mu_);
  stop_requested_ = true;
}

}  // namespace paramserver
