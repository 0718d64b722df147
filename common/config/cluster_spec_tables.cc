#include "common/config/cluster_spec_tables.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"
#include "yaml-cpp/yaml.h"

namespace paramserver {
namespace {

// The keys only some embedding optimizers read, and which; a key absent here (type,
// learning_rate, beta1, beta2, epsilon) every type accepts.
struct TableOptimizerKey {
  const char* name;
  std::vector<EmbeddingOptimizerType> types;
  const char* belongs_to;  // for the error: "a setting of ..."
};
const std::vector<TableOptimizerKey>& TypeSpecificKeys() {
  using T = EmbeddingOptimizerType;
  static const auto* keys = new std::vector<TableOptimizerKey>{
      {"learning_rate_power", {T::kFtrl}, "ftrl only"},
      {"l1", {T::kFtrl}, "ftrl only"},
      {"l2", {T::kFtrl}, "ftrl only"},
      {"beta", {T::kFtrl}, "ftrl only"},
      {"initial_accumulator_value",
       {T::kRowwiseAdagrad, T::kFtrl},
       "rowwise_adagrad and ftrl only"},
  };
  return *keys;
}

// A type's defaults: the struct's, and tf.keras.optimizers.Ftrl's initial accumulator.
EmbeddingOptimizerOptions EmbeddingOptimizerDefaults(EmbeddingOptimizerType type) {
  EmbeddingOptimizerOptions defaults;
  defaults.type = type;
  if (type == EmbeddingOptimizerType::kFtrl) defaults.initial_accumulator_value = 0.1;
  return defaults;
}

constexpr int kMaxTableDim = 1024;

// Whether `value` is still a finite float (the rows update in float32), and, with
// `positive`, still > 0 there.
bool FiniteAsFloat(double value, bool positive) {
  const float as_float = static_cast<float>(value);
  return std::isfinite(as_float) && (!positive || as_float > 0);
}

}  // namespace

std::optional<SettingProblem> FindEmbeddingOptimizerProblem(const EmbeddingOptimizerOptions& o) {
  if (!(o.learning_rate_power <= 0 && FiniteAsFloat(o.learning_rate_power, false))) {
    return SettingProblem{"learning_rate_power",
                          "must be a finite number <= 0 (as tf.keras.optimizers.Ftrl's)"};
  }
  for (const auto& [key, value] :
       {std::make_pair("initial_accumulator_value", o.initial_accumulator_value),
        std::make_pair("l1", o.l1), std::make_pair("l2", o.l2), std::make_pair("beta", o.beta)}) {
    if (!(value >= 0 && FiniteAsFloat(value, false))) {
      return SettingProblem{key, "must be a finite number >= 0"};
    }
  }
  if (!(o.learning_rate > 0 && FiniteAsFloat(o.learning_rate, true))) {
    return SettingProblem{"learning_rate", "must be a positive number (in float32's range)"};
  }
  if (!(o.beta1 >= 0 && o.beta1 < 1)) return SettingProblem{"beta1", "must be in [0, 1)"};
  if (!(o.beta2 >= 0 && o.beta2 < 1)) return SettingProblem{"beta2", "must be in [0, 1)"};
  if (!(o.epsilon > 0 && FiniteAsFloat(o.epsilon, true))) {
    return SettingProblem{"epsilon", "must be a positive number (in float32's range)"};
  }
  return std::nullopt;
}

std::optional<SettingProblem> FindTableSettingsProblem(const EmbeddingTableSettings& settings) {
  if (settings.max_rows.has_value() &&
      (*settings.max_rows < 0 || *settings.max_rows > kMaxTableRows)) {
    return SettingProblem{"max_rows", "must be in [0, 2^40] (0: no bound)"};
  }
  if (settings.min_count.has_value() &&
      (*settings.min_count < 1 || *settings.min_count > 1000000)) {
    return SettingProblem{"min_count", "must be in [1, 10^6] (1: a row at the first sighting)"};
  }
  if (settings.optimizer.has_value()) {
    std::optional<SettingProblem> problem = FindEmbeddingOptimizerProblem(*settings.optimizer);
    if (problem.has_value()) problem->key = "optimizer." + problem->key;
    return problem;
  }
  return std::nullopt;
}

std::vector<CtrTableSpec> CtrTables(const ModelSection& model) {
  if (!model.tables.empty()) return model.tables;
  std::vector<CtrTableSpec> tables;
  for (int t = 0; t < model.categorical_features; ++t) {
    tables.push_back({absl::StrCat("C", t + 1), model.embedding_dim, {}});
  }
  return tables;
}

std::vector<int> CtrTableDims(const ModelSection& model) {
  std::vector<int> dims;
  for (const CtrTableSpec& table : CtrTables(model)) dims.push_back(table.dim);
  return dims;
}

absl::Status ParseEmbeddingOptimizer(YamlMapReader& r, const EmbeddingOptimizerOptions* inherit,
                                     EmbeddingOptimizerOptions* o) {
  std::string type(EmbeddingOptimizerName(inherit != nullptr ? inherit->type : o->type));
  PS_RETURN_IF_ERROR(r.Read("type", &type));
  absl::StatusOr<EmbeddingOptimizerType> parsed = ParseEmbeddingOptimizerType(type);
  if (!parsed.ok()) {
    return r.ErrorAt("type",
                     "must be adam, adagrad, sgd, rowwise_adagrad or ftrl, got '" + type + "'");
  }
  *o = inherit != nullptr && inherit->type == *parsed ? *inherit
                                                      : EmbeddingOptimizerDefaults(*parsed);
  for (const TableOptimizerKey& key : TypeSpecificKeys()) {
    if (r.Has(key.name) &&
        std::find(key.types.begin(), key.types.end(), o->type) == key.types.end()) {
      return r.ErrorAt(key.name, absl::StrCat("is a setting of ", key.belongs_to));
    }
  }
  PS_RETURN_IF_ERROR(r.Read("learning_rate", &o->learning_rate));
  PS_RETURN_IF_ERROR(r.Read("beta1", &o->beta1));
  PS_RETURN_IF_ERROR(r.Read("beta2", &o->beta2));
  PS_RETURN_IF_ERROR(r.Read("epsilon", &o->epsilon));
  PS_RETURN_IF_ERROR(r.Read("initial_accumulator_value", &o->initial_accumulator_value));
  PS_RETURN_IF_ERROR(r.Read("learning_rate_power", &o->learning_rate_power));
  PS_RETURN_IF_ERROR(r.Read("l1", &o->l1));
  PS_RETURN_IF_ERROR(r.Read("l2", &o->l2));
  PS_RETURN_IF_ERROR(r.Read("beta", &o->beta));
  PS_RETURN_IF_ERROR(r.CheckNoUnknownKeys());
  const std::optional<SettingProblem> problem = FindEmbeddingOptimizerProblem(*o);
  return problem.has_value() ? r.ErrorAt(problem->key, problem->problem) : absl::OkStatus();
}

absl::StatusOr<EmbeddingOptimizerOptions> ParseTableOptimizer(
    absl::string_view text, const EmbeddingOptimizerOptions& job_optimizer) {
  YAML::Node node;
  try {
    node = YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer: not a mapping: ", e.what()));
  }
  // No source: errors read "optimizer.<key>: <problem>", for the caller to place.
  YamlMapReader reader(node, "optimizer", "");
  PS_RETURN_IF_ERROR(reader.CheckIsMap());
  EmbeddingOptimizerOptions optimizer;
  try {
    PS_RETURN_IF_ERROR(ParseEmbeddingOptimizer(reader, &job_optimizer, &optimizer));
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer: ", e.what()));
  }
  return optimizer;
}

absl::Status ParseCtrTables(YamlMapReader& tables, YamlMapReader& model_reader, bool layers_given,
                            const EmbeddingOptimizerOptions& job_optimizer, ModelSection* m) {
  m->tables.clear();
  m->tables = CtrTables(*m);
  for (const std::string& name : tables.Keys()) {
    int number = 0;
    if (name.size() < 2 || name[0] != 'C' || !absl::SimpleAtoi(name.substr(1), &number) ||
        number < 1 || number > m->categorical_features || name != absl::StrCat("C", number)) {
      PS_RETURN_IF_ERROR(tables.Section(name).status());  // marks it read
      return tables.ErrorAt(name,
                            absl::StrCat("no such table: this ctr model's tables are C1 to C",
                                         m->categorical_features, " (model.categorical_features)"));
    }
    CtrTableSpec& table = m->tables[number - 1];
    PS_ASSIGN_OR_RETURN(YamlMapReader r, tables.Section(name));
    PS_RETURN_IF_ERROR(r.Read("dim", &table.dim));
    PS_RETURN_IF_ERROR(r.Require(table.dim >= 1 && table.dim <= kMaxTableDim, "dim",
                                 absl::StrCat("must be in [1, ", kMaxTableDim, "]")));
    if (r.Has("max_rows")) {
      int64_t max_rows = 0;
      PS_RETURN_IF_ERROR(r.Read("max_rows", &max_rows));
      table.settings.max_rows = max_rows;
    }
    if (r.Has("min_count")) {
      int min_count = 0;
      PS_RETURN_IF_ERROR(r.Read("min_count", &min_count));
      table.settings.min_count = min_count;
    }
    if (r.Has("optimizer")) {
      PS_ASSIGN_OR_RETURN(YamlMapReader optimizer, r.Section("optimizer"));
      EmbeddingOptimizerOptions parsed;
      PS_RETURN_IF_ERROR(ParseEmbeddingOptimizer(optimizer, &job_optimizer, &parsed));
      table.settings.optimizer = parsed;
    }
    PS_RETURN_IF_ERROR(r.CheckNoUnknownKeys());
    const std::optional<SettingProblem> problem = FindTableSettingsProblem(table.settings);
    if (problem.has_value()) return r.ErrorAt(problem->key, problem->problem);
  }
  PS_RETURN_IF_ERROR(tables.CheckNoUnknownKeys());
  int64_t input = m->dense_features;
  for (const CtrTableSpec& table : m->tables) input += table.dim;
  if (!layers_given) m->layers = {input, 256, 128, 1};
  return model_reader.Require(
      m->layers.size() >= 2 && m->layers.front() == input && m->layers.back() == 1, "layers",
      absl::StrCat("must start with dense_features + the tables' dims (embedding_dim, or a "
                   "table's own in model.tables) = ",
                   input, " and end with 1 (one logit)"));
}

}  // namespace paramserver
