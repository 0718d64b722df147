#include "common/model/step_optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace paramserver {
namespace {

struct NumberField {
  const char* name;  // torch's
  double DenseOptimizerOptions::*member;
  double (StepOptimizerRun::*get)() const;
  void (StepOptimizerRun::*set)(double);
  double low, high;  // the accepted range
  bool high_included;
  bool low_included;
};

const NumberField kNumbers[] = {
    {"lr", &DenseOptimizerOptions::learning_rate, &StepOptimizerRun::lr, &StepOptimizerRun::set_lr,
     0, HUGE_VAL, false, true},
    {"weight_decay", &DenseOptimizerOptions::weight_decay, &StepOptimizerRun::weight_decay,
     &StepOptimizerRun::set_weight_decay, 0, HUGE_VAL, false, true},
    {"momentum", &DenseOptimizerOptions::momentum, &StepOptimizerRun::momentum,
     &StepOptimizerRun::set_momentum, 0, HUGE_VAL, false, true},
    {"dampening", &DenseOptimizerOptions::dampening, &StepOptimizerRun::dampening,
     &StepOptimizerRun::set_dampening, 0, 1, true, true},
    {"betas[0]", &DenseOptimizerOptions::beta1, &StepOptimizerRun::beta1,
     &StepOptimizerRun::set_beta1, 0, 1, false, true},
    {"betas[1]", &DenseOptimizerOptions::beta2, &StepOptimizerRun::beta2,
     &StepOptimizerRun::set_beta2, 0, 1, false, true},
    {"eps", &DenseOptimizerOptions::epsilon, &StepOptimizerRun::eps, &StepOptimizerRun::set_eps, 0,
     HUGE_VAL, false, false},
    {"lr_decay", &DenseOptimizerOptions::lr_decay, &StepOptimizerRun::lr_decay,
     &StepOptimizerRun::set_lr_decay, 0, HUGE_VAL, false, true},
    {"alpha", &DenseOptimizerOptions::alpha, &StepOptimizerRun::alpha, &StepOptimizerRun::set_alpha,
     0, 1, false, true},
};

struct FlagField {
  const char* name;
  bool DenseOptimizerOptions::*member;
  bool (StepOptimizerRun::*get)() const;
  void (StepOptimizerRun::*set)(bool);
};

const FlagField kFlags[] = {
    {"nesterov", &DenseOptimizerOptions::nesterov, &StepOptimizerRun::nesterov,
     &StepOptimizerRun::set_nesterov},
    {"amsgrad", &DenseOptimizerOptions::amsgrad, &StepOptimizerRun::amsgrad,
     &StepOptimizerRun::set_amsgrad},
    {"centered", &DenseOptimizerOptions::centered, &StepOptimizerRun::centered,
     &StepOptimizerRun::set_centered},
};

bool InRange(const NumberField& f, double v) {
  if (!std::isfinite(v)) return false;
  const bool above = f.low_included ? v >= f.low : v > f.low;
  const bool below = f.high_included ? v <= f.high : v < f.high;
  return above && below;
}

std::string RangeOf(const NumberField& f) {
  if (f.high == HUGE_VAL) return f.low_included ? "finite and >= 0" : "finite and > 0";
  return absl::StrCat("in [0, 1", f.high_included ? "]" : ")");
}

bool SameBits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

}  // namespace

void StepHyperparametersToProto(DenseOptimizerType type, const StepHyperparameters& runs,
                                StepOptimizer* proto) {
  proto->Clear();
  proto->set_type(std::string(DenseOptimizerName(type)));
  for (const OptimizerSegment& run : runs) {
    StepOptimizerRun* out = proto->add_runs();
    out->set_begin(run.begin);
    out->set_end(run.end);
    out->set_group(run.group);
    for (const NumberField& f : kNumbers) (out->*f.set)(run.options.*f.member);
    for (const FlagField& f : kFlags) (out->*f.set)(run.options.*f.member);
  }
}

absl::StatusOr<StepHyperparameters> StepHyperparametersFromProto(const StepOptimizer& proto,
                                                                 const DenseOptimizerOptions& spec,
                                                                 int64_t size) {
  if (proto.type() != DenseOptimizerName(spec.type)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the step's optimizer is '", proto.type(), "'; the servers keep the state of ",
                     DenseOptimizerName(spec.type), " (training.optimizer.type)"));
  }
  StepHyperparameters runs;
  int64_t next = 0;
  for (const StepOptimizerRun& in : proto.runs()) {
    const std::string where = absl::StrCat("the step's param_groups[", in.group(), "]");
    if (in.begin() != next || in.end() <= in.begin() || in.end() > size) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, " covers [", in.begin(), ", ", in.end(), ") where parameter ", next,
                       " of ", size, " comes next: runs must cover the range in order"));
    }
    next = in.end();
    OptimizerSegment run;
    run.begin = in.begin();
    run.end = in.end();
    run.group = in.group();
    run.options = DenseOptimizerDefaults(spec.type);
    run.options.initial_accumulator_value = spec.initial_accumulator_value;
    for (const NumberField& f : kNumbers) {
      const double v = (in.*f.get)();
      if (!InRange(f, v)) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, "'s ", f.name, " is ", v, ": it must be ", RangeOf(f)));
      }
      run.options.*f.member = v;
    }
    for (const FlagField& f : kFlags) run.options.*f.member = (in.*f.get)();
    if (spec.type == DenseOptimizerType::kSgd && run.options.nesterov &&
        (run.options.momentum <= 0 || run.options.dampening != 0)) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, " sets nesterov: it needs momentum > 0 and dampening 0 (as torch.optim.SGD)"));
    }
    runs.push_back(run);
  }
  if (next != size) {
    return absl::InvalidArgumentError(absl::StrCat("the step's param_groups cover ", next,
                                                   " of the range's ", size, " parameters"));
  }
  return runs;
}

namespace {

// The first tensor of `layout` with a parameter in [begin, end).
const TensorSlot& TensorAt(const ModelLayout& layout, int64_t begin) {
  const std::vector<TensorSlot>& tensors = layout.dense_tensors();
  auto after = std::upper_bound(
      tensors.begin(), tensors.end(), begin,
      [](int64_t offset, const TensorSlot& tensor) { return offset < tensor.offset; });
  return *(after - 1);
}

std::string SlotList(const DenseOptimizerOptions& options) {
  const std::vector<std::string> names = DenseOptimizerSlotNames(options);
  return names.empty() ? "none" : absl::StrJoin(names, ", ");
}

std::string SpecGroupName(int group) {
  return group < 0 ? std::string("training.optimizer")
                   : absl::StrCat("training.optimizer.groups[", group, "]");
}

}  // namespace

absl::Status CheckStepKeepsSpecState(const StepHyperparameters& step,
                                     const DenseOptimizerOptions& spec, const ModelLayout& layout) {
  if (spec.lr_schedule.warmup_steps > 0 || spec.lr_schedule.decay != LrDecay::kConstant) {
    return absl::InvalidArgumentError(
        "the spec sets training.optimizer.lr_schedule, and a script's optimizer sets its own "
        "rates: drop the spec's schedule, or train with job.step(model)");
  }
  absl::StatusOr<std::vector<OptimizerSegment>> kept = OptimizerSegments(spec, layout);
  if (!kept.ok()) return kept.status();
  for (const OptimizerSegment& wanted : step) {
    for (const OptimizerSegment& run : *kept) {
      const int64_t begin = std::max(run.begin, wanted.begin);
      if (run.is_buffer() || begin >= std::min(run.end, wanted.end)) continue;
      std::string difference;
      if (DenseOptimizerSlotNames(run.options) != DenseOptimizerSlotNames(wanted.options)) {
        difference = absl::StrCat("keeps optimizer state (", SlotList(wanted.options),
                                  ") where the servers keep (", SlotList(run.options), ")");
      } else if (spec.type == DenseOptimizerType::kAdagrad &&
                 !SameBits(run.options.initial_accumulator_value,
                           wanted.options.initial_accumulator_value)) {
        difference = absl::StrCat("sets initial_accumulator_value ",
                                  wanted.options.initial_accumulator_value,
                                  " where the servers' is ", run.options.initial_accumulator_value);
      } else {
        continue;
      }
      return absl::InvalidArgumentError(absl::StrCat(
          "param_groups[", wanted.group, "] ", difference, " for tensor '",
          TensorAt(layout, begin).name, "', as ", SpecGroupName(run.group),
          " sets it: a script's optimizer may change its settings, not the state the servers "
          "keep (set the same momentum, amsgrad, centered and initial_accumulator_value in the "
          "spec)"));
    }
  }
  return absl::OkStatus();
}

std::string DescribeHyperparameterDifference(const StepHyperparameters& a,
                                             const StepHyperparameters& b) {
  if (a.empty() != b.empty()) {
    return a.empty() ? "the first push trains with the spec's settings, the second with its "
                       "param_groups'"
                     : "the first push trains with its param_groups' settings, the second with "
                       "the spec's";
  }
  if (a.size() != b.size()) {
    return absl::StrCat("their param_groups split the shard into ", a.size(), " and ", b.size(),
                        " runs");
  }
  for (size_t k = 0; k < a.size(); ++k) {
    const OptimizerSegment& x = a[k];
    const OptimizerSegment& y = b[k];
    if (x.begin != y.begin || x.end != y.end || x.group != y.group) {
      return absl::StrCat("their param_groups differ: [", x.begin, ", ", x.end, ") in group ",
                          x.group, " and [", y.begin, ", ", y.end, ") in group ", y.group);
    }
    for (const NumberField& f : kNumbers) {
      if (SameBits(x.options.*f.member, y.options.*f.member)) continue;
      return absl::StrCat("group ", x.group, "'s ", f.name, ": ", x.options.*f.member, " and ",
                          y.options.*f.member);
    }
    for (const FlagField& f : kFlags) {
      if (x.options.*f.member == y.options.*f.member) continue;
      return absl::StrCat("group ", x.group, "'s ", f.name, ": ",
                          x.options.*f.member ? "True" : "False", " and ",
                          y.options.*f.member ? "True" : "False");
    }
  }
  return "";
}

}  // namespace paramserver
