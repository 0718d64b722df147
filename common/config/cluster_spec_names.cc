// The spec's words (training modes, model types, row optimizers, devices) and the
// durations it implies.
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/config/cluster_spec.h"

namespace paramserver {

namespace {

constexpr std::pair<DenseOptimizerType, absl::string_view> kDenseOptimizerNames[] = {
    {DenseOptimizerType::kSgd, "sgd"},         {DenseOptimizerType::kAdam, "adam"},
    {DenseOptimizerType::kAdamW, "adamw"},     {DenseOptimizerType::kAdagrad, "adagrad"},
    {DenseOptimizerType::kRmsprop, "rmsprop"},
};

}  // namespace

absl::StatusOr<DenseOptimizerType> ParseDenseOptimizerType(const std::string& name) {
  for (const auto& [type, type_name] : kDenseOptimizerNames) {
    if (name == type_name) return type;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("optimizer '", name, "': one of ", DenseOptimizerNames()));
}

absl::string_view DenseOptimizerName(DenseOptimizerType type) {
  for (const auto& [known, type_name] : kDenseOptimizerNames) {
    if (known == type) return type_name;
  }
  return "?";
}

std::string DenseOptimizerNames() {
  std::string names;
  for (const auto& entry : kDenseOptimizerNames)
    absl::StrAppend(&names, names.empty() ? "" : ", ", entry.second);
  return names;
}

DenseOptimizerOptions DenseOptimizerDefaults(DenseOptimizerType type) {
  DenseOptimizerOptions options;
  options.type = type;
  switch (type) {
    case DenseOptimizerType::kSgd:
      options.learning_rate = 0;  // required
      break;
    case DenseOptimizerType::kAdam:
      break;
    case DenseOptimizerType::kAdamW:
      options.weight_decay = 0.01;
      break;
    case DenseOptimizerType::kAdagrad:
      options.learning_rate = 0.01;
      options.epsilon = 1e-10;
      break;
    case DenseOptimizerType::kRmsprop:
      options.learning_rate = 0.01;
      break;
  }
  return options;
}

namespace {

constexpr std::pair<LrDecay, absl::string_view> kLrDecayNames[] = {
    {LrDecay::kConstant, "constant"},     {LrDecay::kStep, "step"},
    {LrDecay::kMultiStep, "multistep"},   {LrDecay::kExponential, "exponential"},
    {LrDecay::kCosine, "cosine"},         {LrDecay::kLinear, "linear"},
    {LrDecay::kPolynomial, "polynomial"},
};

}  // namespace

absl::StatusOr<LrDecay> ParseLrDecay(const std::string& name) {
  for (const auto& [decay, decay_name] : kLrDecayNames) {
    if (name == decay_name) return decay;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "must be constant, step, multistep, exponential, cosine, linear or polynomial, got '", name,
      "'"));
}

absl::string_view LrDecayName(LrDecay decay) {
  for (const auto& [known, decay_name] : kLrDecayNames) {
    if (known == decay) return decay_name;
  }
  return "?";
}

absl::StatusOr<EmbeddingOptimizerType> ParseEmbeddingOptimizerType(const std::string& name) {
  if (name == "adam") return EmbeddingOptimizerType::kAdam;
  if (name == "adagrad") return EmbeddingOptimizerType::kAdagrad;
  if (name == "sgd") return EmbeddingOptimizerType::kSgd;
  if (name == "rowwise_adagrad") return EmbeddingOptimizerType::kRowwiseAdagrad;
  if (name == "ftrl") return EmbeddingOptimizerType::kFtrl;
  return absl::InvalidArgumentError(absl::StrCat(
      "embedding optimizer '", name, "': one of adam, adagrad, sgd, rowwise_adagrad, ftrl"));
}

absl::string_view EmbeddingOptimizerName(EmbeddingOptimizerType type) {
  switch (type) {
    case EmbeddingOptimizerType::kAdam:
      return "adam";
    case EmbeddingOptimizerType::kAdagrad:
      return "adagrad";
    case EmbeddingOptimizerType::kSgd:
      return "sgd";
    case EmbeddingOptimizerType::kRowwiseAdagrad:
      return "rowwise_adagrad";
    case EmbeddingOptimizerType::kFtrl:
      return "ftrl";
  }
  return "?";
}

absl::Status CheckDeviceName(const std::string& device) {
  if (device == "auto" || device == "cpu" || device == "gpu") return absl::OkStatus();
  if (device.rfind("gpu:", 0) == 0 && device.size() > 4 && device.size() < 8 &&
      device.find_first_not_of("0123456789", 4) == std::string::npos) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(
      absl::StrCat("must be auto, cpu, gpu or gpu:N, got '", device, "'"));
}

absl::string_view TrainingModeName(TrainingMode mode) {
  switch (mode) {
    case TrainingMode::kSync:
      return "sync";
    case TrainingMode::kAsync:
      return "async";
    case TrainingMode::kSsp:
      return "ssp";
  }
  return "?";
}

TrainingMode ShardTrainingMode(const TrainingSection& training, bool embedding_shard) {
  return embedding_shard && training.async_tables ? TrainingMode::kAsync : training.mode;
}

std::string TrainingModesText(const TrainingSection& training) {
  return absl::StrCat(TrainingModeName(training.mode),
                      training.async_tables ? " (embedding tables async)" : "");
}

const char* ModelTypeName(ModelType type) {
  switch (type) {
    case ModelType::kCtr:
      return "ctr";
    case ModelType::kTorch:
      return "torch";
    case ModelType::kMlp:
      break;
  }
  return "mlp";
}

absl::Duration RecoveryTimeout(const ClusterSection& cluster) {
  if (cluster.recovery_timeout_ms > 0) return absl::Milliseconds(cluster.recovery_timeout_ms);
  return std::max(absl::Seconds(30), 10 * absl::Milliseconds(cluster.failure_timeout_ms));
}

}  // namespace paramserver
