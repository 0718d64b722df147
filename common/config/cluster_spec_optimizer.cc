#include "common/config/cluster_spec_optimizer.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
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

// torch.optim's own checks (its ValueErrors), and those that keep the state finite. A
// group (is_group) inherits its learning rate, and torch checks nesterov on the defaults
// alone.
absl::Status ValidateOptimizer(YamlMapReader& r, const DenseOptimizerOptions& o,
                               bool is_group = false) {
  using T = DenseOptimizerType;
  if (o.type == T::kSgd && !is_group && !r.Has("learning_rate")) {
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
  // torch.optim.SGD checks nesterov against its defaults alone; a group that turns
  // momentum off keeps no buffer, and nesterov means nothing there (ParseGroups).
  if (o.nesterov && !is_group && (o.momentum <= 0 || o.dampening != 0)) {
    return r.ErrorAt("nesterov", "needs momentum > 0 and dampening 0 (as torch.optim.SGD)");
  }
  PS_RETURN_IF_ERROR(Require(o.lr_decay >= 0, r, "lr_decay", "must be >= 0"));
  PS_RETURN_IF_ERROR(
      Require(o.initial_accumulator_value >= 0, r, "initial_accumulator_value", "must be >= 0"));
  return Require(o.alpha >= 0 && o.alpha < 1, r, "alpha", "must be in [0, 1)");
}

// The keys each decay reads (beside decay, warmup_steps and warmup_start_factor).
const std::vector<std::pair<const char*, std::vector<LrDecay>>>& LrScheduleKeys() {
  static const auto* keys = new std::vector<std::pair<const char*, std::vector<LrDecay>>>{
      {"step_size", {LrDecay::kStep}},
      {"milestones", {LrDecay::kMultiStep}},
      {"gamma", {LrDecay::kStep, LrDecay::kMultiStep, LrDecay::kExponential}},
      {"total_steps", {LrDecay::kCosine, LrDecay::kLinear, LrDecay::kPolynomial}},
      {"min_learning_rate", {LrDecay::kCosine}},
      {"end_factor", {LrDecay::kLinear}},
      {"power", {LrDecay::kPolynomial}},
  };
  return *keys;
}

absl::Status ValidateLrSchedule(YamlMapReader& r, const LrSchedule& l, double learning_rate,
                                int64_t max_steps) {
  PS_RETURN_IF_ERROR(Require(l.warmup_steps >= 0, r, "warmup_steps", "must be >= 0"));
  if (max_steps > 0 && l.warmup_steps > max_steps) {
    return r.ErrorAt("warmup_steps",
                     absl::StrCat("is longer than the job (training.max_steps: ", max_steps, ")"));
  }
  PS_RETURN_IF_ERROR(Require(l.warmup_start_factor > 0 && l.warmup_start_factor <= 1, r,
                             "warmup_start_factor", "must be in (0, 1], as LinearLR's"));
  for (const auto& [key, value] :
       {std::make_pair("gamma", l.gamma), std::make_pair("min_learning_rate", l.min_learning_rate),
        std::make_pair("end_factor", l.end_factor), std::make_pair("power", l.power)}) {
    if (!std::isfinite(value)) return r.ErrorAt(key, "must be a finite number");
  }
  switch (l.decay) {
    case LrDecay::kConstant:
      return absl::OkStatus();
    case LrDecay::kStep:
      PS_RETURN_IF_ERROR(Require(l.step_size >= 1, r, "step_size", "must be >= 1 for step"));
      return Require(l.gamma > 0, r, "gamma", "must be > 0");
    case LrDecay::kMultiStep:
      PS_RETURN_IF_ERROR(
          Require(!l.milestones.empty(), r, "milestones", "must list steps for multistep"));
      for (size_t i = 0; i < l.milestones.size(); ++i) {
        PS_RETURN_IF_ERROR(
            Require(l.milestones[i] >= 1 && (i == 0 || l.milestones[i] > l.milestones[i - 1]), r,
                    "milestones", "must be ascending steps >= 1"));
      }
      return Require(l.gamma > 0, r, "gamma", "must be > 0");
    case LrDecay::kExponential:
      return Require(l.gamma > 0, r, "gamma", "must be > 0");
    case LrDecay::kCosine:
    case LrDecay::kLinear:
    case LrDecay::kPolynomial:
      PS_RETURN_IF_ERROR(
          Require(l.total_steps > l.warmup_steps, r, "total_steps",
                  absl::StrCat("must be more than warmup_steps (", l.warmup_steps, ") for ",
                               LrDecayName(l.decay), ": the decay runs over the steps after it")));
      PS_RETURN_IF_ERROR(Require(l.min_learning_rate >= 0 && l.min_learning_rate <= learning_rate,
                                 r, "min_learning_rate", "must be in [0, learning_rate]"));
      PS_RETURN_IF_ERROR(
          Require(l.end_factor >= 0 && l.end_factor <= 1, r, "end_factor", "must be in [0, 1]"));
      return Require(l.power >= 0, r, "power", "must be >= 0");
  }
  return absl::OkStatus();
}

absl::Status ParseLrSchedule(YamlMapReader& r, LrSchedule* l, double learning_rate,
                             int64_t max_steps) {
  std::string decay_name(LrDecayName(l->decay));
  PS_RETURN_IF_ERROR(r.Read("decay", &decay_name));
  absl::StatusOr<LrDecay> decay = ParseLrDecay(decay_name);
  if (!decay.ok()) return r.ErrorAt("decay", std::string(decay.status().message()));
  l->decay = *decay;
  for (const auto& [key, decays] : LrScheduleKeys()) {
    if (!r.Has(key) || std::find(decays.begin(), decays.end(), l->decay) != decays.end()) continue;
    std::string owners;
    for (LrDecay owner : decays)
      absl::StrAppend(&owners, owners.empty() ? "" : ", ", LrDecayName(owner));
    return r.ErrorAt(key, absl::StrCat("is not a setting of the ", decay_name, " decay (it is of ",
                                       owners, ")"));
  }
  PS_RETURN_IF_ERROR(r.Read("warmup_steps", &l->warmup_steps));
  PS_RETURN_IF_ERROR(r.Read("warmup_start_factor", &l->warmup_start_factor));
  PS_RETURN_IF_ERROR(r.Read("step_size", &l->step_size));
  PS_RETURN_IF_ERROR(r.ReadList("milestones", &l->milestones));
  PS_RETURN_IF_ERROR(r.Read("gamma", &l->gamma));
  PS_RETURN_IF_ERROR(r.Read("total_steps", &l->total_steps));
  PS_RETURN_IF_ERROR(r.Read("min_learning_rate", &l->min_learning_rate));
  PS_RETURN_IF_ERROR(r.Read("end_factor", &l->end_factor));
  PS_RETURN_IF_ERROR(r.Read("power", &l->power));
  PS_RETURN_IF_ERROR(r.CheckNoUnknownKeys());
  return ValidateLrSchedule(r, *l, learning_rate, max_steps);
}

// Each group: its patterns, then any key of the optimizer's type over the optimizer's own.
absl::Status ParseGroups(std::vector<YamlMapReader>& groups, DenseOptimizerOptions* optimizer) {
  DenseOptimizerOptions inherited = *optimizer;
  inherited.groups.clear();
  for (YamlMapReader& g : groups) {
    DenseOptimizerGroup& group = optimizer->groups.emplace_back();
    group.options = inherited;
    PS_RETURN_IF_ERROR(g.ReadStringList("params", &group.params, "tensor name pattern"));
    if (group.params.empty()) {
      return g.ErrorAt("params",
                       "must list the group's tensors by name pattern (\"*.bias\", "
                       "\"fc1.*\")");
    }
    PS_RETURN_IF_ERROR(CheckKeysBelongTo(g, optimizer->type));
    if (g.Has("clip_grad_norm")) {
      return g.ErrorAt("clip_grad_norm",
                       "is the whole model's (torch's clip_grad_norm_ takes every parameter's "
                       "gradient), not a group's: set it on training.optimizer");
    }
    PS_RETURN_IF_ERROR(ReadOptimizerKeys(g, &group.options));
    PS_RETURN_IF_ERROR(g.CheckNoUnknownKeys());
    PS_RETURN_IF_ERROR(ValidateOptimizer(g, group.options, /*is_group=*/true));
    if (group.options.momentum <= 0) group.options.nesterov = false;
    if (group.options.learning_rate < group.options.lr_schedule.min_learning_rate) {
      return g.ErrorAt("learning_rate",
                       absl::StrCat("is below lr_schedule.min_learning_rate (",
                                    group.options.lr_schedule.min_learning_rate,
                                    "): the cosine decay would raise this group's rate"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ParseOptimizer(YamlMapReader& r, DenseOptimizerOptions* optimizer, int64_t max_steps) {
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
  const bool clip_given = r.Has("clip_grad_norm");
  PS_RETURN_IF_ERROR(r.Read("clip_grad_norm", &optimizer->clip_grad_norm));
  if (clip_given && !(std::isfinite(optimizer->clip_grad_norm) && optimizer->clip_grad_norm > 0)) {
    return r.ErrorAt("clip_grad_norm",
                     absl::StrCat("must be a finite number > 0 (leave it out for no clipping), "
                                  "got ",
                                  optimizer->clip_grad_norm));
  }
  PS_ASSIGN_OR_RETURN(YamlMapReader schedule, r.Section("lr_schedule"));
  PS_ASSIGN_OR_RETURN(std::vector<YamlMapReader> groups, r.SectionList("groups"));
  PS_RETURN_IF_ERROR(r.CheckNoUnknownKeys());
  PS_RETURN_IF_ERROR(ValidateOptimizer(r, *optimizer));
  PS_RETURN_IF_ERROR(
      ParseLrSchedule(schedule, &optimizer->lr_schedule, optimizer->learning_rate, max_steps));
  return ParseGroups(groups, optimizer);
}

}  // namespace paramserver
