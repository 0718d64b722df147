#include "worker/ctr_trainer.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "spdlog/spdlog.h"
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
  PS_ASSIGN_OR_RETURN(const int64_t steps_per_epoch,
                      StepLoop::StepsPerEpoch(options, train->example_count));
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
    : shape_(options.shape),
      train_(train),
      test_(test),
      ps_(ps),
      compute_(compute),
      loop_(std::move(options), train->example_count, steps_per_epoch, ps),
      mlp_(mlp_parameters) {}

CtrBatchView CtrTrainer::GatherBatch(int64_t position) {
  const absl::Span<const int64_t> examples = loop_.BatchExamples(position);
  const int64_t batch = static_cast<int64_t>(examples.size());
  const int dense = train_->dense_features, fields = train_->categorical_features;
  batch_dense_.resize(batch * dense);
  batch_ids_.resize(batch * fields);
  batch_labels_.resize(batch);
  for (int64_t i = 0; i < batch; ++i) {
    const int64_t example = examples[i];
    std::copy(train_->dense.begin() + example * dense,
              train_->dense.begin() + (example + 1) * dense, batch_dense_.begin() + i * dense);
    std::copy(train_->ids.begin() + example * fields, train_->ids.begin() + (example + 1) * fields,
              batch_ids_.begin() + i * fields);
    batch_labels_[i] = train_->labels[example];
  }
  return {batch, batch_dense_.data(), batch_ids_.data(), batch_labels_.data()};
}

absl::StatusOr<StepResult> CtrTrainer::TrainStep(const StepInput& in, TrainingSummary* summary) {
  const int64_t step = in.step;
  StepResult result;
  absl::Time start = absl::Now();
  // A push that failed is sent again as it was: recomputing it could read shards that
  // other workers' pushes of this step have moved on meanwhile.
  if (unacknowledged_step_ != step) {
    const CtrBatchView batch = GatherBatch(in.position);
    BatchRows rows = DeduplicateIds(shape_, batch);
    std::vector<std::vector<float>> pulled(rows.unique_ids.size());
    absl::Time done = absl::Now();
    summary->compute_seconds += absl::ToDoubleSeconds(done - start);
    start = done;
    if (prefetched_step_ == step) {
      // The last push brought this step's MLP (in mlp_) and rows back with it.
      pulled = std::move(prefetched_rows_);
    } else {
      result.transfer =
          ps_->Pull({step, {absl::MakeSpan(mlp_), rows.unique_ids, absl::MakeSpan(pulled)}});
      if (!result.transfer.ok()) return result;
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
  if (!std::isfinite(pending_result_.loss)) {  // nothing is pushed
    return absl::FailedPreconditionError(absl::StrCat(
        "step ", step, ": the loss is ", static_cast<float>(pending_result_.loss),
        "; lower the learning rates (training.optimizer, training.embedding_optimizer)"));
  }
  // Within an epoch the next batch is known: its rows come back with this push, with the
  // MLP, in the same round trip (a step is then one call per server).
  if (in.position + 1 < in.steps_per_epoch && !in.last()) {
    const BatchRows next = DeduplicateIds(shape_, GatherBatch(in.position + 1));
    prefetched_rows_.resize(next.unique_ids.size());
    const absl::StatusOr<bool> pulled = ps_->Push(
        {step, pending_result_.dense_gradient, pending_rows_.unique_ids,
         pending_result_.row_gradients,
         StepValues{absl::MakeSpan(mlp_), next.unique_ids, absl::MakeSpan(prefetched_rows_)}});
    result.transfer = pulled.status();
    if (pulled.ok() && *pulled) prefetched_step_ = step + 1;
  } else {
    result.transfer = ps_->Push({step, pending_result_.dense_gradient, pending_rows_.unique_ids,
                                 pending_result_.row_gradients})
                          .status();
  }
  if (!result.transfer.ok()) return result;
  summary->push_seconds += absl::ToDoubleSeconds(absl::Now() - start);
  result.loss = static_cast<float>(pending_result_.loss);
  last_pushed_step_ = step;
  unacknowledged_step_ = -1;
  std::swap(last_rows_, pending_rows_);
  std::swap(last_result_, pending_result_);
  return result;
}

absl::Status CtrTrainer::ResendLastPush() {
  if (last_pushed_step_ < 0) return absl::OkStatus();
  return ps_
      ->Push({last_pushed_step_, last_result_.dense_gradient, last_rows_.unique_ids,
              last_result_.row_gradients})
      .status();
}

void CtrTrainer::Rewound(int64_t /*step*/) {
  last_pushed_step_ = -1;
  unacknowledged_step_ = -1;
}

absl::Status CtrTrainer::EvaluateEpoch(int64_t step, int epoch,
                                       std::optional<int64_t>* /*rewind*/) {
  absl::StatusOr<CtrEvaluation> evaluation = Evaluate(step, *test_, nullptr);
  if (!evaluation.ok()) {
    // A rollback or a recovery that outlasted the evaluation: training goes on.
    spdlog::warn("epoch {} evaluation skipped: {}", epoch, evaluation.status().ToString());
    return MapChangeMayCure(evaluation.status()) ? absl::OkStatus() : evaluation.status();
  }
  spdlog::info("epoch {} test_auc={:.4f} test_logloss={:.4f}", epoch, evaluation->auc,
               evaluation->logloss);
  const ScalarSink& on_scalar = loop_.options().on_scalar;
  if (on_scalar) {
    on_scalar("test_auc", step, evaluation->auc);
    on_scalar("test_logloss", step, evaluation->logloss);
  }
  loop_.recorder()->Update([&](NodeProgress* progress) {
    progress->set_test_auc(evaluation->auc);
    progress->set_test_logloss(evaluation->logloss);
    progress->set_accuracy_step(step);
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
    const BatchRows rows = DeduplicateIds(shape_, batch);
    std::vector<std::vector<float>> pulled(rows.unique_ids.size());
    std::optional<absl::Time> give_up_at;
    while (true) {
      const absl::Status status =
          ps_->Pull({step, {absl::MakeSpan(weights), rows.unique_ids, absl::MakeSpan(pulled)}});
      if (status.ok()) break;
      PS_ASSIGN_OR_RETURN(
          const ShardMapUpdate update,
          WaitForRecovery(ps_, status, step, loop_.options().recovery_timeout, &give_up_at));
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

}  // namespace paramserver
