#include "common/config/cluster_spec_optimizer.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace paramserver {
namespace {

absl::Status Require(bool ok, YamlMapReader& reader, const std::string& key,
                     const std::string& problem) {
  return ok ? absl::OkStatus() : reader.ErrorAt(key, problem);
}

// The optimizer keys each type reads (beside type, learning_rate and weight_decay).
struct OptimizerKey {
  const char* name;
  std::vector<DenseOptimizerType> types;
};
const std::vector<OptimizerKey>& OptimizerKeys() {
  using T = DenseOptimizerType;
  static const auto* keys = new std::vector<OptimizerKey>{
      {"beta1", {T::kAdam, T::kAdamW}},
      {"beta2", {T::kAdam, T::kAdamW}},
      {"epsilon", {T::kAdam, T::kAdamW, T::kAdagrad, T::kRmsprop}},
      {"amsgrad", {T::kAdam, T::kAdamW}},
      {"momentum", {T::kSgd, T::kRmsprop}},
      {"dampening", {T::kSgd}},
      {"nesterov", {T::kSgd}},
      {"lr_decay", {T::kAdagrad}},
      {"initial_accumulator_value", {T::kAdagrad}},
      {"alpha", {T::kRmsprop}},
      {"centered", {T::kRmsprop}},
  };
  return *keys;
}

// A key of another optimizer type is named as such, not as an unknown key.
absl::Status CheckKeysBelongTo(YamlMapReader& r, DenseOptimizerType type) {
  for (const OptimizerKey& key : OptimizerKeys()) {
    if (!r.Has(key.name) ||
        std::find(key.types.begin(), key.types.end(), type) != key.types.end()) {
      continue;
    }
    std::string owners;
    for (DenseOptimizerType owner : key.types)
      absl::StrAppend(&owners, owners.empty() ? "" : ", ", DenseOptimizerName(owner));
    return r.ErrorAt(key.name, absl::StrCat("is not a setting of ", DenseOptimizerName(type),
                                            " (it is one of ", owners, ")"));
  }
  return absl::OkStatus();
}

absl::Status ReadOptimizerKeys(YamlMapReader& r, DenseOptimizerOptions* o) {
  const struct {
    const char* name;
    double* number;
    bool* flag;
  } fields[] = {
      {"learning_rate", &o->learning_rate, nullptr},
      {"weight_decay", &o->weight_decay, nullptr},
      {"beta1", &o->beta1, nullptr},
      {"beta2", &o->beta2, nullptr},
      {"epsilon", &o->epsilon, nullptr},
      {"amsgrad", nullptr, &o->amsgrad},
      {"momentum", &o->momentum, nullptr},
      {"dampening", &o->dampening, nullptr},
      {"nesterov", nullptr, &o->nesterov},
      {"lr_decay", &o->lr_decay, nullptr},
      {"initial_accumulator_value", &o->initial_accumulator_value, nullptr},
      {"alpha", &o->alpha, nullptr},
      {"centered", nullptr, &o->centered},
  };
  for (const auto& field : fields) {
    PS_RETURN_IF_ERROR(field.number != nullptr ? r.Read(field.name, field.number)
                                               : r.Read(field.name, field.flag));
  }
  for (const auto& field : fields) {
    if (field.number == nullptr || std::isfinite(*field.number)) continue;
    return r.ErrorAt(field.name, "must be a finite number");
  }
  return absl::OkStatus();
}

// torch.optim's own checks (its ValueErrors), and those that keep the state finite.
absl::Status ValidateOptimizer(YamlMapReader& r, const DenseOptimizerOptions& o) {
  using T = DenseOptimizerType;
  if (o.type == T::kSgd && !r.Has("learning_rate")) {
    return r.ErrorAt("type",
                     "sgd has no default learning rate (torch.optim.SGD requires lr): "
                     "set learning_rate");
  }
  PS_RETURN_IF_ERROR(Require(o.learning_rate > 0, r, "learning_rate", "must be a positive number"));
  PS_RETURN_IF_ERROR(Require(o.weight_decay >= 0, r, "weight_decay", "must be >= 0"));
  PS_RETURN_IF_ERROR(Require(o.beta1 >= 0 && o.beta1 < 1, r, "beta1", "must be in [0, 1)"));
  PS_RETURN_IF_ERROR(Require(o.beta2 >= 0 && o.beta2 < 1, r, "beta2", "must be in [0, 1)"));
  PS_RETURN_IF_ERROR(Require(o.epsilon > 0, r, "epsilon", "must be a positive number"));
  PS_RETURN_IF_ERROR(Require(o.momentum >= 0, r, "momentum", "must be >= 0"));
  PS_RETURN_IF_ERROR(
      Require(o.dampening >= 0 && o.dampening <= 1, r, "dampening", "must be in [0, 1]"));
  if (o.nesterov && (o.momentum <= 0 || o.dampening != 0)) {
    return r.ErrorAt("nesterov", "needs momentum > 0 and dampening 0 (as torch.optim.SGD)");
  }
  PS_RETURN_IF_ERROR(Require(o.lr_decay >= 0, r, "lr_decay", "must be >= 0"));
  PS_RETURN_IF_ERROR(
      Require(o.initial_accumulator_value >= 0, r, "initial_accumulator_value", "must be >= 0"));
  return Require(o.alpha >= 0 && o.alpha < 1, r, "alpha", "must be in [0, 1)");
}

}  // namespace

absl::Status ParseOptimizer(YamlMapReader& r, DenseOptimizerOptions* optimizer) {
  std::string type_name(DenseOptimizerName(optimizer->type));
  PS_RETURN_IF_ERROR(r.Read("type", &type_name));
  absl::StatusOr<DenseOptimizerType> type = ParseDenseOptimizerType(type_name);
  if (!type.ok()) {
    return r.ErrorAt(
        "type", absl::StrCat("must be one of ", DenseOptimizerNames(), ", got '", type_name, "'"));
  }
  *optimizer = DenseOptimizerDefaults(*type);
  PS_RETURN_IF_ERROR(CheckKeysBelongTo(r, *type));
  PS_RETURN_IF_ERROR(ReadOptimizerKeys(r, optimizer));
  PS_RETURN_IF_ERROR(r.CheckNoUnknownKeys());
  return ValidateOptimizer(r, *optimizer);
}

}  // namespace paramserver
