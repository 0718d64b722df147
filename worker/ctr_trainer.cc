#include "worker/ctr_trainer.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/shard_layout.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"
#include "worker/batch_order.h"
#include "worker/ctr_metrics.h"
#include "worker/recovery.h"

namespace paramserver {
namespace {

// Examples scored per pull when evaluating: each pull carries the batch's rows.
constexpr int64_t kEvaluationBatch = 4096;

int64_t MlpParameters(const std::vector<int64_t>& layers) {
  int64_t total = 0;
  for (size_t l = 0; l + 1 < layers.size(); ++l) total += layers[l + 1] * (layers[l] + 1);
  return total;
}

// Examples [begin, begin + size) of `data`, in place.
CtrBatchView SliceOf(const CtrDataset& data, int64_t begin, int64_t size) {
  return {size, data.dense.data() + begin * data.dense_features,
          data.ids.data() + begin * data.categorical_features, data.labels.data() + begin};
}

}  // namespace

absl::StatusOr<std::unique_ptr<CtrTrainer>> CtrTrainer::Create(CtrTrainerOptions options,
                                                               const CtrDataset* train,
                                                               const CtrDataset* test, PsClient* ps,
                                                               CtrCompute* compute) {
  PS_RETURN_IF_ERROR(ValidateCtrModelShape(options.shape));
  for (const CtrDataset* data : {train, test}) {
    if (data == nullptr) continue;
    if (data->dense_features != options.shape.dense_features ||
        data->categorical_features != options.shape.categorical_features) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the data has ", data->dense_features, " dense and ", data->categorical_features,
          " categorical features per example; the model takes ", options.shape.dense_features,
          " and ", options.shape.categorical_features));
    }
  }
  const int64_t steps_per_epoch =
      StepsPerEpoch(train->example_count, options.num_workers, options.training.batch_size);
  if (steps_per_epoch < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("training.batch_size ", options.training.batch_size,
                     " is larger than the smallest worker's share (", train->example_count,
                     " examples / ", options.num_workers, " workers)"));
  }
  if (options.evaluate_each_epoch && test == nullptr) {
    return absl::InvalidArgumentError("evaluation needs a test set");
  }
  const int64_t mlp_parameters = MlpParameters(options.shape.layers);
  return std::unique_ptr<CtrTrainer>(new CtrTrainer(std::move(options), train, test, ps, compute,
                                                    steps_per_epoch, mlp_parameters));
}

CtrTrainer::CtrTrainer(CtrTrainerOptions options, const CtrDataset* train, const CtrDataset* test,
                       PsClient* ps, CtrCompute* compute, int64_t steps_per_epoch,
                       int64_t mlp_parameters)
    : options_(std::move(options)),
      train_(train),
      test_(test),
      ps_(ps),
      compute_(compute),
      steps_per_epoch_(steps_per_epoch),
      total_steps_(options_.training.max_steps > 0
                       ? std::min<int64_t>(options_.training.max_steps,
                                           steps_per_epoch * options_.training.epochs)
                       : steps_per_epoch * options_.training.epochs),
      mlp_(mlp_parameters),
      recorder_(options_.start_step, total_steps_, options_.training.batch_size,
                options_.progress_log_interval, options_.on_scalar) {}

CtrBatchView CtrTrainer::GatherBatch(int64_t position) {
  const int64_t batch = options_.training.batch_size;
  const int dense = train_->dense_features, fields = train_->categorical_features;
  batch_dense_.resize(batch * dense);
  batch_ids_.resize(batch * fields);
  batch_labels_.resize(batch);
  for (int64_t i = 0; i < batch; ++i) {
    const int64_t example = order_[position * batch + i];
    std::copy(train_->dense.begin() + example * dense,
              train_->dense.begin() + (example + 1) * dense, batch_dense_.begin() + i * dense);
    std::copy(train_->ids.begin() + example * fields, train_->ids.begin() + (example + 1) * fields,
              batch_ids_.begin() + i * fields);
    batch_labels_[i] = train_->labels[example];
  }
  return {batch, batch_dense_.data(), batch_ids_.data(), batch_labels_.data()};
}

absl::Status CtrTrainer::TrainStep(int64_t step, int64_t position, float* loss,
                                   TrainingSummary* summary) {
  absl::Time start = absl::Now();
  // A push that failed is sent again as it was: recomputing it could read shards that
  // other workers' pushes of this step have moved on meanwhile.
  if (unacknowledged_step_ != step) {
    const CtrBatchView batch = GatherBatch(position);
    BatchRows rows = DeduplicateIds(options_.shape, batch);
    std::vector<std::vector<float>> pulled;
    absl::Time done = absl::Now();
    summary->compute_seconds += absl::ToDoubleSeconds(done - start);
    start = done;
    if (prefetched_step_ == step) {
      // The last push brought this step's MLP (in mlp_) and rows back with it.
      pulled = std::move(prefetched_rows_);
    } else {
      PS_RETURN_IF_ERROR(ps_->PullWithRows(step, absl::MakeSpan(mlp_), rows.unique_ids, &pulled));
    }
    prefetched_step_ = -1;
    done = absl::Now();
    summary->pull_seconds += absl::ToDoubleSeconds(done - start);
    start = done;
    PS_ASSIGN_OR_RETURN(pending_result_, compute_->Step(mlp_, batch, rows, pulled, true));
    pending_rows_ = std::move(rows);
    unacknowledged_step_ = step;
    done = absl::Now();
    summary->compute_seconds += absl::ToDoubleSeconds(done - start);
    start = done;
  }
  *loss = static_cast<float>(pending_result_.loss);
  if (!std::isfinite(pending_result_.loss)) return absl::OkStatus();  // Run stops: no push
  // Within an epoch the next batch is known: its rows come back with this push, with the
  // MLP, in the same round trip (a step is then one call per server).
  const bool prefetch = position + 1 < steps_per_epoch_ && step + 1 < total_steps_;
  if (prefetch) {
    const BatchRows next = DeduplicateIds(options_.shape, GatherBatch(position + 1));
    PS_ASSIGN_OR_RETURN(
        const bool pulled,
        ps_->PushWithRowsAndPullNext(step, pending_result_.dense_gradient, pending_rows_.unique_ids,
                                     pending_result_.row_gradients, next.unique_ids,
                                     absl::MakeSpan(mlp_), &prefetched_rows_));
    if (pulled) prefetched_step_ = step + 1;
  } else {
    PS_RETURN_IF_ERROR(ps_->PushWithRows(step, pending_result_.dense_gradient,
                                         pending_rows_.unique_ids, pending_result_.row_gradients));
  }
  summary->push_seconds += absl::ToDoubleSeconds(absl::Now() - start);
  last_pushed_step_ = step;
  unacknowledged_step_ = -1;
  std::swap(last_rows_, pending_rows_);
  std::swap(last_result_, pending_result_);
  return absl::OkStatus();
}

absl::Status CtrTrainer::Recover(const absl::Status& failure, int64_t* step) {
  prefetched_step_ = -1;  // what came back may be partial
  PS_ASSIGN_OR_RETURN(
      const ShardMapUpdate update,
      WaitForRecovery(ps_, failure, *step, options_.recovery_timeout, &give_up_at_));
  if (!update.epoch_changed) return absl::OkStatus();
  if (update.rewind_to.has_value()) {
    *step = *update.rewind_to;
    last_pushed_step_ = -1;
    unacknowledged_step_ = -1;
    return absl::OkStatus();
  }
  if (last_pushed_step_ >= 0) {
    // A moved shard's new owner may lack our last push; the others ignore the repeat.
    absl::Status repushed = ps_->PushWithRows(last_pushed_step_, last_result_.dense_gradient,
                                              last_rows_.unique_ids, last_result_.row_gradients);
    if (!repushed.ok()) return MapChangeMayCure(repushed) ? absl::OkStatus() : repushed;
  }
  return absl::OkStatus();
}

absl::StatusOr<TrainingSummary> CtrTrainer::Run() {
  const ParameterRange range =
      ContiguousPart(train_->example_count, options_.num_workers, options_.worker_rank);
  spdlog::info("training steps {}..{} ({} per epoch) on examples [{}, {}) with batch {} on {}",
               options_.start_step, total_steps_, steps_per_epoch_, range.begin, range.end,
               options_.training.batch_size, compute_->name());
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
    float loss = 0;
    const absl::Status status = TrainStep(step, step % steps_per_epoch_, &loss, &summary);
    if (!status.ok()) {
      PS_RETURN_IF_ERROR(Recover(status, &step));
      continue;
    }
    if (!std::isfinite(loss)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "step ", step, ": the loss is ", loss,
          "; lower the learning rates (training.optimizer, training.embedding_optimizer)"));
    }
    if (give_up_at_.has_value()) {
      spdlog::info("step {} completed: recovered", step);
      give_up_at_.reset();
    }
    recorder_.Record(step, epoch, loss, start, &summary);
    PS_RETURN_IF_ERROR(MaybeEvaluateEpoch(step, epoch));
    ++step;
  }
  summary.seconds = absl::ToDoubleSeconds(absl::Now() - start);
  return summary;
}

absl::Status CtrTrainer::MaybeEvaluateEpoch(int64_t step, int epoch) {
  const bool epoch_done = (step % steps_per_epoch_) + 1 == steps_per_epoch_;
  if (!options_.evaluate_each_epoch || !epoch_done || step + 1 >= total_steps_) {
    return absl::OkStatus();
  }
  absl::StatusOr<CtrEvaluation> evaluation = Evaluate(step + 1, *test_, nullptr);
  if (!evaluation.ok()) {
    // A rollback or a recovery that outlasted the evaluation: training goes on.
    spdlog::warn("epoch {} evaluation skipped: {}", epoch, evaluation.status().ToString());
    return MapChangeMayCure(evaluation.status()) ? absl::OkStatus() : evaluation.status();
  }
  spdlog::info("epoch {} test_auc={:.4f} test_logloss={:.4f}", epoch, evaluation->auc,
               evaluation->logloss);
  if (options_.on_scalar) {
    options_.on_scalar("test_auc", step + 1, evaluation->auc);
    options_.on_scalar("test_logloss", step + 1, evaluation->logloss);
  }
  recorder_.Update([&](NodeProgress* progress) {
    progress->set_test_auc(evaluation->auc);
    progress->set_test_logloss(evaluation->logloss);
    progress->set_accuracy_step(step + 1);
  });
  return absl::OkStatus();
}

absl::StatusOr<CtrEvaluation> CtrTrainer::Evaluate(int64_t step, const CtrDataset& test,
                                                   std::vector<float>* mlp) {
  std::vector<float> weights(mlp_.size());
  std::vector<float> logits;
  logits.reserve(test.example_count);
  for (int64_t begin = 0; begin < test.example_count; begin += kEvaluationBatch) {
    const CtrBatchView batch =
        SliceOf(test, begin, std::min(kEvaluationBatch, test.example_count - begin));
    const BatchRows rows = DeduplicateIds(options_.shape, batch);
    std::vector<std::vector<float>> pulled;
    std::optional<absl::Time> give_up_at;
    while (true) {
      const absl::Status status =
          ps_->PullWithRows(step, absl::MakeSpan(weights), rows.unique_ids, &pulled);
      if (status.ok()) break;
      PS_ASSIGN_OR_RETURN(
          const ShardMapUpdate update,
          WaitForRecovery(ps_, status, step, options_.recovery_timeout, &give_up_at));
      if (update.rewind_to.has_value()) {
        return absl::AbortedError(
            absl::StrCat("the servers rolled back to step ", *update.rewind_to));
      }
    }
    PS_ASSIGN_OR_RETURN(const CtrStepResult scored,
                        compute_->Step(weights, batch, rows, pulled, /*backward=*/false));
    logits.insert(logits.end(), scored.logits.begin(), scored.logits.end());
  }
  CtrEvaluation evaluation;
  evaluation.examples = test.example_count;
  PS_ASSIGN_OR_RETURN(evaluation.auc, ExactAuc(logits, test.labels));
  evaluation.logloss = MeanLogLoss(logits, test.labels);
  if (mlp != nullptr) *mlp = std::move(weights);
  return evaluation;
}

NodeProgress CtrTrainer::progress() const { return recorder_.progress(); }

}  // namespace paramserver
