#include "ps/dense_update_rule.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "ps/dense_optimizer.h"
#include "ps/optimizer_state_limit.h"

namespace paramserver {
namespace {

// The runs of a range with their settings: `segments`, or one run of `options` over
// all `size` parameters when there are none.
std::vector<OptimizerSegment> RunsOf(const DenseOptimizerOptions& options,
                                     const std::vector<OptimizerSegment>& segments, int64_t size) {
  if (!segments.empty()) return segments;
  OptimizerSegment all;
  all.begin = 0;
  all.end = size;
  all.options = options;
  all.options.groups.clear();
  return {all};
}

// Each run's optimizer over its part of the range. The rule's slots are every slot any
// run keeps, in the type's order; a run without one (a group without momentum beside one
// with it) saves zeros there and ignores them when resumed.
class SegmentedRule final : public DenseUpdateRule {
 public:
  struct Run {
    int64_t begin, end;
    DenseOptimizer optimizer;  // a buffer run's keeps no slots and is never applied
    DenseTensorKind kind = DenseTensorKind::kParameter;
  };
  SegmentedRule(std::string name, std::vector<std::string> slot_names, std::vector<Run> runs,
                int64_t size)
      : name_(std::move(name)),
        slot_names_(std::move(slot_names)),
        runs_(std::move(runs)),
        size_(size) {}

  // Each optimizer counts its own steps: `step` is always their next one.
  void Apply(int64_t, absl::Span<const float> gradient, absl::Span<float> values,
             const StepHyperparameters& settings) override {
    for (size_t k = 0; k < runs_.size(); ++k) {
      Run& run = runs_[k];
      const size_t n = static_cast<size_t>(run.end - run.begin);
      if (run.kind != DenseTensorKind::kParameter) {
        float* value = values.data() + run.begin;
        const float* change = gradient.data() + run.begin;
        for (size_t i = 0; i < n; ++i) value[i] += change[i];
        if (run.kind == DenseTensorKind::kIntegerBuffer) {
          for (size_t i = 0; i < n; ++i) value[i] = std::nearbyint(value[i]);
        }
        continue;
      }
      run.optimizer.Apply(gradient.subspan(run.begin, n), values.subspan(run.begin, n),
                          SettingsOf(run, settings));
    }
  }
  size_t FirstUnsafeElement(int64_t, absl::Span<const float> gradient,
                            absl::Span<const float> values,
                            const StepHyperparameters& settings) const override {
    for (const Run& run : runs_) {
      const size_t n = static_cast<size_t>(run.end - run.begin);
      if (run.kind != DenseTensorKind::kParameter) {
        for (size_t i = static_cast<size_t>(run.begin); i < static_cast<size_t>(run.end); ++i) {
          if (!StateValueAccepted(values[i] + gradient[i])) return i;
        }
        continue;
      }
      const size_t unsafe = run.optimizer.FirstUnsafeElement(
          gradient.subspan(run.begin, n), values.subspan(run.begin, n), SettingsOf(run, settings));
      if (unsafe < n) return static_cast<size_t>(run.begin) + unsafe;
    }
    return gradient.size();
  }
  absl::Status PrepareFor(const StepHyperparameters& settings) override {
    for (const OptimizerSegment& wanted : settings) {
      const std::vector<std::string> keeps = DenseOptimizerSlotNames(wanted.options);
      for (const Run& run : runs_) {
        if (run.kind != DenseTensorKind::kParameter || run.end <= wanted.begin ||
            run.begin >= wanted.end)
          continue;
        const std::vector<std::string> kept = DenseOptimizerSlotNames(run.optimizer.options());
        if (kept == keeps) continue;
        return absl::InvalidArgumentError(absl::StrCat(
            "param_groups[", wanted.group, "] keeps optimizer state (", absl::StrJoin(keeps, ","),
            ") where the servers keep (", absl::StrJoin(kept, ","), ") for parameters [",
            std::max(run.begin, wanted.begin), ", ", std::min(run.end, wanted.end),
            ") of the shard, as training.optimizer and its groups set them: a script's optimizer "
            "may change its settings, not the state it keeps"));
      }
    }
    for (const OptimizerSegment& wanted : settings) {
      SplitAt(wanted.begin);
      SplitAt(wanted.end);
    }
    return absl::OkStatus();
  }
  void SaveState(ShardState* state) const override {
    state->optimizer = name_;
    state->slots.assign(slot_names_.size(), std::vector<float>(static_cast<size_t>(size_)));
    for (const Run& run : runs_) {
      const std::vector<std::string> names = DenseOptimizerSlotNames(run.optimizer.options());
      for (size_t k = 0; k < names.size(); ++k) {
        const size_t slot = SlotIndex(names[k]);
        std::copy(run.optimizer.slots()[k].begin(), run.optimizer.slots()[k].end(),
                  state->slots[slot].begin() + run.begin);
      }
    }
  }

 private:
  // The settings of `settings`' run that holds all of `run` (PrepareFor split the runs at
  // their boundaries), or null for none given.
  static const DenseOptimizerOptions* SettingsOf(const Run& run,
                                                 const StepHyperparameters& settings) {
    for (const OptimizerSegment& wanted : settings) {
      if (wanted.begin <= run.begin && run.end <= wanted.end) return &wanted.options;
    }
    return nullptr;
  }
  // Makes `at` the start of a run, if it is inside one: two optimizers, each with its part
  // of the slots and the same step count, update exactly as the one did.
  void SplitAt(int64_t at) {
    for (size_t k = 0; k < runs_.size(); ++k) {
      Run& run = runs_[k];
      if (at <= run.begin || at >= run.end) continue;
      const size_t cut = static_cast<size_t>(at - run.begin);
      std::vector<std::vector<float>> head, tail;
      for (const std::vector<float>& slot : run.optimizer.slots()) {
        head.emplace_back(slot.begin(), slot.begin() + cut);
        tail.emplace_back(slot.begin() + cut, slot.end());
      }
      const DenseOptimizerOptions options = run.optimizer.options();
      const int64_t step = run.optimizer.step();
      const DenseTensorKind kind = run.kind;
      Run second{at, run.end, DenseOptimizer(options, step, std::move(tail)), kind};
      run = Run{run.begin, at, DenseOptimizer(options, step, std::move(head)), kind};
      runs_.insert(runs_.begin() + static_cast<std::ptrdiff_t>(k) + 1, std::move(second));
      return;
    }
  }

  size_t SlotIndex(const std::string& name) const {
    return static_cast<size_t>(std::find(slot_names_.begin(), slot_names_.end(), name) -
                               slot_names_.begin());
  }

  const std::string name_;
  const std::vector<std::string> slot_names_;
  std::vector<Run> runs_;
  const int64_t size_;
};

}  // namespace

std::vector<std::string> DenseRuleSlotNames(const DenseOptimizerOptions& options) {
  // Every slot the type can keep, in its order: the names with every flag on.
  DenseOptimizerOptions all = options;
  all.momentum = 1;
  all.amsgrad = all.centered = true;
  std::vector<const DenseOptimizerOptions*> settings = {&options};
  for (const DenseOptimizerGroup& group : options.groups) settings.push_back(&group.options);
  std::vector<std::string> names;
  for (const std::string& name : DenseOptimizerSlotNames(all)) {
    for (const DenseOptimizerOptions* some : settings) {
      const std::vector<std::string> kept = DenseOptimizerSlotNames(*some);
      if (std::find(kept.begin(), kept.end(), name) == kept.end()) continue;
      names.push_back(name);
      break;
    }
  }
  return names;
}

std::string DenseRuleStateName(const DenseOptimizerOptions& options) {
  return absl::StrCat(DenseOptimizerName(options.type), "(",
                      absl::StrJoin(DenseRuleSlotNames(options), ","), ")");
}

std::unique_ptr<DenseUpdateRule> MakeDenseUpdateRule(
    const DenseOptimizerOptions& options, int64_t size,
    const std::vector<OptimizerSegment>& segments) {
  std::vector<SegmentedRule::Run> runs;
  for (const OptimizerSegment& run : RunsOf(options, segments, size))
    runs.push_back(
        {run.begin, run.end, DenseOptimizer(run.options, run.end - run.begin), run.kind});
  return std::make_unique<SegmentedRule>(DenseRuleStateName(options), DenseRuleSlotNames(options),
                                         std::move(runs), size);
}

absl::Status CheckResumableState(const DenseOptimizerOptions& options, const ShardState& state) {
  const std::string name = DenseRuleStateName(options);
  const std::vector<std::string> slots = DenseRuleSlotNames(options);
  if (state.optimizer != name || state.slots.size() != slots.size()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard ", state.shard_id, " was saved with optimizer state ", state.optimizer, " (",
        state.slots.size(), " arrays per parameter); the spec's training.optimizer keeps ", name,
        ": resume with the optimizer settings the job was saved with (its type, and whether it "
        "keeps momentum, amsgrad's maximum or a centered average)"));
  }
  for (size_t k = 0; k < slots.size(); ++k) {
    if (static_cast<int64_t>(state.slots[k].size()) != state.range.size()) {
      return absl::FailedPreconditionError(
          absl::StrCat("shard ", state.shard_id, ": its ", slots[k], " holds ",
                       state.slots[k].size(), " floats for ", state.range.size(), " parameters"));
    }
  }
  return absl::OkStatus();
}

std::unique_ptr<DenseUpdateRule> ResumeDenseUpdateRule(
    const DenseOptimizerOptions& options, ShardState* state,
    const std::vector<OptimizerSegment>& segments) {
  const int64_t size = state->range.size();
  const std::vector<std::string> slot_names = DenseRuleSlotNames(options);
  std::vector<SegmentedRule::Run> runs;
  for (const OptimizerSegment& run : RunsOf(options, segments, size)) {
    std::vector<std::vector<float>> slots;
    for (const std::string& name : DenseOptimizerSlotNames(run.options)) {
      const std::vector<float>& whole =
          state->slots[std::find(slot_names.begin(), slot_names.end(), name) - slot_names.begin()];
      slots.emplace_back(whole.begin() + run.begin, whole.begin() + run.end);
    }
    runs.push_back(
        {run.begin, run.end,
         DenseOptimizer(run.options, state->step - state->skipped_steps, std::move(slots)),
         run.kind});
  }
  state->slots.clear();
  return std::make_unique<SegmentedRule>(DenseRuleStateName(options), slot_names, std::move(runs),
                                         size);
}

}  // namespace paramserver
