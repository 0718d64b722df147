#include "worker/step_loop.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "common/wire/shard_layout.h"
#include "spdlog/spdlog.h"
#include "worker/batch_order.h"
#include "worker/recovery.h"

namespace paramserver {

absl::StatusOr<int64_t> StepLoop::StepsPerEpoch(const StepLoopOptions& options,
                                                int64_t example_count) {
  const int64_t steps_per_epoch =
      paramserver::StepsPerEpoch(example_count, options.num_workers, options.training.batch_size);
  if (options.lease_data && example_count >= options.training.batch_size) {
    return std::max<int64_t>(1, steps_per_epoch);
  }
  if (steps_per_epoch < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("training.batch_size ", options.training.batch_size,
                     " is larger than the smallest worker's share (", example_count, " examples / ",
                     options.num_workers, " workers)"));
  }
  return steps_per_epoch;
}

StepLoop::StepLoop(StepLoopOptions options, int64_t example_count, int64_t steps_per_epoch,
                   PsClient* ps)
    : options_(std::move(options)),
      example_count_(example_count),
      steps_per_epoch_(steps_per_epoch),
      total_steps_(options_.training.max_steps > 0
                       ? std::min<int64_t>(options_.training.max_steps,
                                           steps_per_epoch * options_.training.epochs)
                       : steps_per_epoch * options_.training.epochs),
      ps_(ps),
      recorder_(options_.start_step, total_steps_, options_.training.batch_size,
                options_.progress_log_interval, options_.on_scalar) {}

absl::Span<const int64_t> StepLoop::BatchExamples(int64_t position) const {
  const int64_t batch = options_.training.batch_size;
  return absl::MakeConstSpan(order_).subspan(position * batch, batch);
}

absl::Status StepLoop::Recover(StepModel* model, const absl::Status& failure, int64_t* step,
                               std::optional<absl::Time>* give_up_at) {
  PS_ASSIGN_OR_RETURN(const ShardMapUpdate update,
                      WaitForRecovery(ps_, failure, *step, options_.recovery_timeout, give_up_at));
  if (!update.epoch_changed && !update.rejoined) return absl::OkStatus();
  recovering_ = true;
  if (update.rewind_to.has_value()) {
    *step = *update.rewind_to;
    rewound_ = true;
    model->Rewound(*step);
    return absl::OkStatus();
  }
  const absl::Status resent = model->ResendLastPush();
  return resent.ok() || MapChangeMayCure(resent) ? absl::OkStatus() : resent;
}

absl::StatusOr<int64_t> StepLoop::PresentStep(int64_t step) {
  std::optional<absl::Time> give_up_at;
  while (true) {
    absl::StatusOr<int64_t> present = ps_->StartStep();
    if (present.ok()) return present;
    PS_RETURN_IF_ERROR(
        WaitForRecovery(ps_, present.status(), step, options_.recovery_timeout, &give_up_at)
            .status());
  }
}

void StepLoop::LogRecovered(bool recovered, int64_t step, absl::Duration took) {
  // The step that met a failure or a map change, and how long it took (the pause).
  if (recovered) {
    spdlog::info("step {} completed: recovered; it took {:.1f} ms", step,
                 absl::ToDoubleMilliseconds(took));
  }
}

absl::StatusOr<TrainingSummary> StepLoop::Run(StepModel* model) {
  if (options_.lease_data) return RunLeased(model);
  const ParameterRange range =
      ContiguousPart(example_count_, options_.num_workers, options_.worker_rank);
  spdlog::info("training steps {}..{} ({} per epoch) on examples [{}, {}) with batch {} on {}",
               options_.start_step, total_steps_, steps_per_epoch_, range.begin, range.end,
               options_.training.batch_size, model->compute_name());
  const absl::Time start = absl::Now();
  TrainingSummary summary;
  int order_epoch = -1;
  int64_t step = options_.start_step;
  while (step < total_steps_) {
    if (stop_requested_.load()) return absl::CancelledError(absl::StrCat("stopped at step ", step));
    const int epoch = static_cast<int>(step / steps_per_epoch_);
    if (epoch != order_epoch) {
      order_ = EpochExampleOrder(range, epoch, options_.training.seed, options_.training.shuffle);
      order_epoch = epoch;
    }
    const StepInput in{step, step % steps_per_epoch_, steps_per_epoch_, total_steps_};
    PS_ASSIGN_OR_RETURN(const StepResult result, model->TrainStep(in, &summary));
    if (!result.transfer.ok()) {
      model->ForgetPrefetched();
      PS_RETURN_IF_ERROR(Recover(model, result.transfer, &step, &give_up_at_));
      continue;
    }
    const bool recovered = give_up_at_.has_value() && recovering_;
    give_up_at_.reset();
    recovering_ = false;
    // The step after an epoch's evaluation includes it: not timed. A push every shard
    // dropped as late trained none of its examples.
    bool dropped = false;
    const std::optional<int64_t> behind_to = ServersStepAhead(step, &dropped);
    const absl::Duration took =
        recorder_.Record(step, epoch, result.loss, start, &summary, /*samples=*/dropped ? 0 : -1,
                         /*timed=*/in.position != 0 || step == 0);
    LogRecovered(recovered, step, took);
    const bool epoch_done = in.position + 1 == steps_per_epoch_;
    if (options_.evaluate_each_epoch && epoch_done && !in.last()) {
      std::optional<int64_t> rewind;
      PS_RETURN_IF_ERROR(model->EvaluateEpoch(step + 1, epoch, &rewind));
      if (rewind.has_value()) {
        model->ForgetPrefetched();
        step = *rewind;
        continue;
      }
    }
    ++step;
    if (behind_to.has_value()) {
      model->ForgetPrefetched();  // the next step pulls the servers' values afresh
      const int64_t from = step;
      step = std::min(*behind_to, total_steps_);
      summary.steps = step;
      // Rank 0 evaluates at the end of an epoch the jump passed (the last of them), on
      // the weights it lands on; the end of the last epoch is the job's final evaluation.
      if (options_.evaluate_each_epoch && step < total_steps_ &&
          step / steps_per_epoch_ > from / steps_per_epoch_) {
        std::optional<int64_t> rewind;
        PS_RETURN_IF_ERROR(
            model->EvaluateEpoch(step, static_cast<int>(step / steps_per_epoch_) - 1, &rewind));
        if (rewind.has_value()) {
          model->ForgetPrefetched();
          step = *rewind;
        }
      }
    }
  }
  summary.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return summary;
}

std::optional<int64_t> StepLoop::ServersStepAhead(int64_t step, bool* dropped) {
  *dropped = false;
  if (options_.training.backup_workers == 0) return std::nullopt;
  const PushAcknowledgement pushed = ps_->last_push();
  if (pushed.shards == 0) return std::nullopt;
  const bool ahead = pushed.least_shard_step > step + 1;
  *dropped = pushed.late_everywhere();
  if (*dropped) {
    ++late_steps_;
    // Every jump past the next step (the others went on while this worker was slow), and
    // a sample of the others.
    if (late_steps_ == 1 || late_steps_ % 100 == 0 || ahead) {
      spdlog::info(
          "the push of step {} was late on every shard (their step completed with the other "
          "workers' pushes: training.sync.backup_workers); going on at step {} ({} late so "
          "far)",
          step, std::max(step + 1, pushed.least_shard_step), late_steps_);
    }
  } else if (ahead) {
    // Taken as a repeat (a backup promoted since, which cannot tell a late push from one),
    // yet every shard is past the next step.
    spdlog::info("every shard is past step {}: going on at step {}", step + 1,
                 pushed.least_shard_step);
  }
  if (!ahead) return std::nullopt;
  return pushed.least_shard_step;
}

absl::StatusOr<TrainingSummary> StepLoop::RunLeased(StepModel* model) {
  DataLeaser leaser(options_.lease_data, example_count_, options_.training.batch_size,
                    options_.training.seed, options_.training.shuffle);
  spdlog::info("training leased chunks of the {} examples from step {} with batch {} on {}",
               example_count_, options_.start_step, options_.training.batch_size,
               model->compute_name());
  const absl::Time start = absl::Now();
  TrainingSummary summary;
  std::optional<LeasedChunk> chunk;
  int64_t position = 0;   // the next batch of the chunk
  int latest_epoch = -1;  // the highest epoch leased so far
  int64_t step = options_.start_step;
  while (true) {
    if (stop_requested_.load()) return absl::CancelledError(absl::StrCat("stopped at step ", step));
    if (!chunk.has_value() || position == chunk->batches) {
      absl::StatusOr<std::optional<LeasedChunk>> next =
          leaser.Next(step, &stop_requested_, options_.recovery_timeout);
      if (!next.ok() && next.status().code() == absl::StatusCode::kFailedPrecondition) {
        // Declared dead while asking (the scheduler says to register again): ridden out
        // as a refused push is, until re-admitted, and the step moves to the job's.
        PS_RETURN_IF_ERROR(Recover(model, next.status(), &step, &give_up_at_));
        chunk.reset();
        continue;
      }
      PS_ASSIGN_OR_RETURN(chunk, std::move(next));
      if (!chunk.has_value()) break;  // every epoch is trained
      const int epoch = chunk->lease.epoch();
      if (options_.evaluate_each_epoch && latest_epoch >= 0 && epoch > latest_epoch) {
        // The first lease of a later epoch: about the end of the one before (the other
        // workers may still train its last leases).
        std::optional<int64_t> rewind;
        const int64_t rejoins = ps_->rejoins();
        rewound_ = false;
        PS_RETURN_IF_ERROR(model->EvaluateEpoch(step, latest_epoch, &rewind));
        if (rewind.has_value() || rewound_ || ps_->rejoins() != rejoins) {
          // Admitted again during the evaluation: the scheduler took this lease back.
          PS_ASSIGN_OR_RETURN(
              step, rewind.has_value() ? absl::StatusOr<int64_t>(*rewind) : PresentStep(step));
          model->ForgetPrefetched();
          model->Rewound(step);
          chunk.reset();
          continue;
        }
      }
      latest_epoch = std::max(latest_epoch, epoch);
      order_ = chunk->examples;
      position = 0;
      if (chunk->lease.first_step() != step) {
        spdlog::info("lease {} starts at step {}, past this worker's own earlier pushes",
                     chunk->lease.lease_id(), chunk->lease.first_step());
        step = chunk->lease.first_step();
        model->Rewound(step);
      }
    }
    // No lease is known past this one: the batch after the lease's last is not gathered
    // ahead, and no step is the last.
    const StepInput in{step, position, chunk->batches, std::numeric_limits<int64_t>::max()};
    PS_ASSIGN_OR_RETURN(const StepResult result, model->TrainStep(in, &summary));
    if (!result.transfer.ok()) {
      model->ForgetPrefetched();
      rewound_ = false;
      PS_RETURN_IF_ERROR(Recover(model, result.transfer, &step, &give_up_at_));
      // Readmitted after being declared dead: the scheduler took the lease back.
      if (rewound_) chunk.reset();
      continue;
    }
    const bool recovered = give_up_at_.has_value() && recovering_;
    give_up_at_.reset();
    recovering_ = false;
    LogRecovered(recovered, step,
                 recorder_.Record(step, chunk->lease.epoch(), result.loss, start, &summary,
                                  /*samples=*/-1,
                                  /*timed=*/position != 0 || step == options_.start_step));
    const absl::Span<const int64_t> trained = BatchExamples(position);
    NoteTrainedBatch(chunk->lease.epoch(), trained.data(), static_cast<int64_t>(trained.size()));
    ++position;
    ++step;
  }
  summary.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return summary;
}

}  // namespace paramserver
