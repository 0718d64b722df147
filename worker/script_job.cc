#include "worker/script_job.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/status_macros.h"
#include "common/checkpoint/safetensors.h"
#include "spdlog/spdlog.h"

namespace paramserver {

ScriptJob::ScriptJob(ClusterSpec spec) : spec_(std::move(spec)) {}

absl::Status ScriptJob::Declare(const ModelLayout& layout, absl::Span<const float> initial_values) {
  if (loop_ != nullptr) {
    return absl::FailedPreconditionError("the model is declared already (register once)");
  }
  if (initial_values.size() != static_cast<size_t>(layout.dense_parameters())) {
    return absl::InvalidArgumentError(absl::StrCat(initial_values.size(),
                                                   " initial values for a model of ",
                                                   layout.dense_parameters(), " parameters"));
  }
  if (!spec_.model.init_from.empty()) {
    // The file must hold this model, named and shaped as declared: said here, by name,
    // rather than by a server at placement.
    PS_RETURN_IF_ERROR(LoadDenseParameters(layout, spec_.model.init_from).status());
  }
  layout_ = layout;
  return absl::OkStatus();
}

ServerModel ScriptJob::server_model() const {
  ServerModel model{layout_.dense_parameters(), {}};
  for (const EmbeddingTableSlot& table : layout_.embedding_tables())
    model.embedding_dims.push_back(static_cast<int>(table.dim));
  return model;
}

absl::Status ScriptJob::CreateLoop(const JobEnvironment& environment) {
  ScriptTrainingOptions options;
  options.total_parameters = layout_.dense_parameters();
  options.embedding_tables = static_cast<int>(layout_.embedding_tables().size());
  options.training = spec_.training;
  options.start_step = environment.start_step;
  options.recovery_timeout = environment.recovery_timeout;
  options.on_scalar = environment.on_scalar;
  options.lease_data = environment.lease_data;
  loop_ = std::make_unique<ScriptTrainingLoop>(options, environment.ps);
  export_tables_ = environment.export_tables;
  return absl::OkStatus();
}

absl::StatusOr<FinalEvaluation> ScriptJob::EvaluateFinal(int64_t /*steps*/) {
  if (loop_ == nullptr) return absl::FailedPreconditionError("the script declared no model");
  // The script evaluated (or not).
  FinalEvaluation evaluation;
  if (const std::optional<double> accuracy = loop_->test_accuracy()) {
    evaluation.result.set_test_accuracy(*accuracy);
    evaluation.summary_line = absl::StrFormat("test_accuracy=%.4f", *accuracy);
    evaluation.scalars = {{"test_accuracy", *accuracy}};
  } else {
    evaluation.result.set_no_test_accuracy(true);
    evaluation.summary_line = "(no test accuracy: the script reported none)";
  }
  return evaluation;
}

absl::Status ScriptJob::WriteFinalWeights(int64_t steps, const std::string& path) {
  if (loop_ == nullptr) return absl::FailedPreconditionError("the script declared no model");
  // The weights are the servers' at the last step.
  std::vector<float> weights(layout_.dense_parameters());
  PS_RETURN_IF_ERROR(loop_->PullCurrent(absl::MakeSpan(weights)));
  std::vector<NamedTensor> tensors = DenseTensorsOf(layout_, weights);
  std::vector<std::string> names;
  std::vector<int> dims;
  for (const EmbeddingTableSlot& table : layout_.embedding_tables()) {
    names.push_back(table.name);
    dims.push_back(static_cast<int>(table.dim));
  }
  if (!names.empty()) {
    if (!export_tables_) return absl::FailedPreconditionError("no way to export the tables");
    PS_ASSIGN_OR_RETURN(const std::vector<TableRows> tables, export_tables_(steps));
    for (NamedTensor& tensor : TensorsOfTables(tables, names, dims))
      tensors.push_back(std::move(tensor));
  }
  PS_RETURN_IF_ERROR(WriteSafetensorsFile(path, tensors));
  spdlog::info("wrote the final weights to {}", path);
  return absl::OkStatus();
}

}  // namespace paramserver
