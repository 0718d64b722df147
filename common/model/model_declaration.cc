#include "common/model/model_declaration.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status_macros.h"

namespace paramserver {
namespace {

std::string ShapeText(const google::protobuf::RepeatedField<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::string KindText(int kind) {
  switch (kind) {
    case TENSOR_KIND_PARAMETER:
      return "a parameter";
    case TENSOR_KIND_FLOAT_BUFFER:
      return "a float32 buffer";
    case TENSOR_KIND_INTEGER_BUFFER:
      return "an int64 buffer";
  }
  return absl::StrCat("of kind ", kind);
}

absl::StatusOr<DenseTensorKind> KindOfDeclaration(const TensorDeclaration& tensor) {
  switch (tensor.kind()) {
    case TENSOR_KIND_PARAMETER:
      return DenseTensorKind::kParameter;
    case TENSOR_KIND_FLOAT_BUFFER:
      return DenseTensorKind::kFloatBuffer;
    case TENSOR_KIND_INTEGER_BUFFER:
      return DenseTensorKind::kIntegerBuffer;
    default:
      return absl::InvalidArgumentError(absl::StrCat("tensor '", tensor.name(), "' has kind ",
                                                     static_cast<int>(tensor.kind()),
                                                     ", which is none of TensorKind's"));
  }
}

absl::Status CheckName(const std::string& what, const std::string& name) {
  if (name.size() > kMaxDeclaredNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat(what, " '", name.substr(0, 64),
                                                   "...': names are at most ",
                                                   kMaxDeclaredNameBytes, " bytes"));
  }
  return absl::OkStatus();
}

// A declared table's own settings, as the layout holds them (checked by ModelLayout).
absl::StatusOr<EmbeddingTableSettings> SettingsOfDeclaration(const TableDeclaration& table) {
  EmbeddingTableSettings settings;
  if (table.has_max_rows()) settings.max_rows = table.max_rows();
  if (table.has_min_count()) settings.min_count = table.min_count();
  if (!table.has_optimizer()) return settings;
  const EmbeddingOptimizerSettings& given = table.optimizer();
  absl::StatusOr<EmbeddingOptimizerType> type = ParseEmbeddingOptimizerType(given.type());
  if (!type.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("embedding table '", table.name(),
                                                   "': optimizer.type: ", type.status().message()));
  }
  EmbeddingOptimizerOptions& optimizer = settings.optimizer.emplace();
  optimizer.type = *type;
  optimizer.learning_rate = given.learning_rate();
  optimizer.beta1 = given.beta1();
  optimizer.beta2 = given.beta2();
  optimizer.epsilon = given.epsilon();
  optimizer.initial_accumulator_value = given.initial_accumulator_value();
  optimizer.learning_rate_power = given.learning_rate_power();
  optimizer.l1 = given.l1();
  optimizer.l2 = given.l2();
  optimizer.beta = given.beta();
  return settings;
}

void DeclareSettings(const EmbeddingTableSettings& settings, TableDeclaration* table) {
  if (settings.max_rows.has_value()) table->set_max_rows(*settings.max_rows);
  if (settings.min_count.has_value()) table->set_min_count(*settings.min_count);
  if (!settings.optimizer.has_value()) return;
  const EmbeddingOptimizerOptions& optimizer = *settings.optimizer;
  EmbeddingOptimizerSettings* declared = table->mutable_optimizer();
  declared->set_type(std::string(EmbeddingOptimizerName(optimizer.type)));
  declared->set_learning_rate(optimizer.learning_rate);
  declared->set_beta1(optimizer.beta1);
  declared->set_beta2(optimizer.beta2);
  declared->set_epsilon(optimizer.epsilon);
  declared->set_initial_accumulator_value(optimizer.initial_accumulator_value);
  declared->set_learning_rate_power(optimizer.learning_rate_power);
  declared->set_l1(optimizer.l1);
  declared->set_l2(optimizer.l2);
  declared->set_beta(optimizer.beta);
}

// A table's own settings as text, for an error ("none" for the spec's).
std::string SettingsText(const TableDeclaration& table) {
  TableDeclaration settings = table;
  settings.clear_name();
  settings.clear_dim();
  settings.DiscardUnknownFields();  // a newer peer's fields are not settings this job reads
  const std::string text = settings.ShortDebugString();
  return text.empty() ? "none (the spec's)" : text;
}

}  // namespace

absl::StatusOr<ModelLayout> LayoutOfDeclaration(const ModelDeclaration& declaration) {
  if (declaration.tensors_size() > kMaxDeclaredTensors) {
    return absl::InvalidArgumentError(absl::StrCat("the model declares ",
                                                   declaration.tensors_size(), " tensors; at most ",
                                                   kMaxDeclaredTensors));
  }
  if (declaration.tables_size() > kMaxDeclaredTables) {
    return absl::InvalidArgumentError(absl::StrCat("the model declares ", declaration.tables_size(),
                                                   " embedding tables; at most ",
                                                   kMaxDeclaredTables));
  }
  if (declaration.tensors_size() == 0 && declaration.tables_size() == 0) {
    return absl::InvalidArgumentError("the model declares no tensors and no embedding tables");
  }
  std::vector<ModelLayout::DenseTensorSpec> dense;
  dense.reserve(declaration.tensors_size());
  int64_t parameters = 0;
  for (const TensorDeclaration& tensor : declaration.tensors()) {
    PS_RETURN_IF_ERROR(CheckName("tensor", tensor.name()));
    if (tensor.shape_size() > kMaxDeclaredRank) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", tensor.name(), "' has ",
                                                     tensor.shape_size(), " dimensions; at most ",
                                                     kMaxDeclaredRank));
    }
    int64_t size = 1;
    for (int64_t d : tensor.shape()) {
      if (d < 1 || d > kMaxDeclaredParameters || size > kMaxDeclaredParameters / d) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor '", tensor.name(), "' has shape ", ShapeText(tensor.shape()),
                         ": every dimension must be >= 1 and the size at most 2^36"));
      }
      size *= d;
    }
    parameters += size;
    if (parameters > kMaxDeclaredParameters) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the model has more than 2^36 dense parameters at tensor '", tensor.name(), "'"));
    }
    PS_ASSIGN_OR_RETURN(const DenseTensorKind kind, KindOfDeclaration(tensor));
    dense.push_back({tensor.name(), {tensor.shape().begin(), tensor.shape().end()}, kind});
  }
  std::vector<EmbeddingTableSlot> tables;
  for (const TableDeclaration& table : declaration.tables()) {
    PS_RETURN_IF_ERROR(CheckName("embedding table", table.name()));
    if (table.dim() < 1 || table.dim() > kMaxDeclaredTableDim) {
      return absl::InvalidArgumentError(
          absl::StrCat("embedding table '", table.name(), "' has dim ", table.dim(),
                       "; it must be in [1, ", kMaxDeclaredTableDim, "]"));
    }
    PS_ASSIGN_OR_RETURN(EmbeddingTableSettings settings, SettingsOfDeclaration(table));
    tables.push_back({table.name(), table.dim(), std::move(settings)});
  }
  return ModelLayout::Create(dense, std::move(tables));
}

ModelDeclaration DeclarationOf(const ModelLayout& layout) {
  ModelDeclaration declaration;
  for (const TensorSlot& slot : layout.dense_tensors()) {
    TensorDeclaration* tensor = declaration.add_tensors();
    tensor->set_name(slot.name);
    for (int64_t d : slot.shape) tensor->add_shape(d);
    tensor->set_kind(slot.kind == DenseTensorKind::kFloatBuffer     ? TENSOR_KIND_FLOAT_BUFFER
                     : slot.kind == DenseTensorKind::kIntegerBuffer ? TENSOR_KIND_INTEGER_BUFFER
                                                                    : TENSOR_KIND_PARAMETER);
  }
  for (const EmbeddingTableSlot& slot : layout.embedding_tables()) {
    TableDeclaration* table = declaration.add_tables();
    table->set_name(slot.name);
    table->set_dim(slot.dim);
    DeclareSettings(slot.settings, table);
  }
  return declaration;
}

absl::Status CheckSameModel(const ModelDeclaration& job, const ModelDeclaration& mine,
                            const std::string& declared_by) {
  const std::string theirs = absl::StrCat("the job's model (declared by ", declared_by, ")");
  const int tensors = std::max(job.tensors_size(), mine.tensors_size());
  for (int i = 0; i < tensors; ++i) {
    if (i >= job.tensors_size()) {
      return absl::FailedPreconditionError(
          absl::StrCat("tensor '", mine.tensors(i).name(), "' (parameter ", i, " here) is not in ",
                       theirs, ", which has ", job.tensors_size(), " tensors"));
    }
    const TensorDeclaration& expected = job.tensors(i);
    if (i >= mine.tensors_size()) {
      return absl::FailedPreconditionError(absl::StrCat("tensor '", expected.name(), "' of ",
                                                        theirs, " is missing here (",
                                                        mine.tensors_size(), " tensors)"));
    }
    const TensorDeclaration& got = mine.tensors(i);
    if (got.name() != expected.name()) {
      return absl::FailedPreconditionError(absl::StrCat("parameter ", i, " is tensor '", got.name(),
                                                        "' here but '", expected.name(), "' in ",
                                                        theirs));
    }
    if (!std::equal(got.shape().begin(), got.shape().end(), expected.shape().begin(),
                    expected.shape().end())) {
      return absl::FailedPreconditionError(
          absl::StrCat("tensor '", got.name(), "' has shape ", ShapeText(got.shape()), " here but ",
                       ShapeText(expected.shape()), " in ", theirs));
    }
    if (got.kind() != expected.kind()) {
      return absl::FailedPreconditionError(absl::StrCat("tensor '", got.name(), "' is ",
                                                        KindText(got.kind()), " here but ",
                                                        KindText(expected.kind()), " in ", theirs));
    }
  }
  const int tables = std::max(job.tables_size(), mine.tables_size());
  for (int i = 0; i < tables; ++i) {
    if (i >= job.tables_size()) {
      return absl::FailedPreconditionError(
          absl::StrCat("embedding table '", mine.tables(i).name(), "' is not in ", theirs));
    }
    if (i >= mine.tables_size()) {
      return absl::FailedPreconditionError(absl::StrCat("embedding table '", job.tables(i).name(),
                                                        "' of ", theirs, " is missing here"));
    }
    const TableDeclaration& expected = job.tables(i);
    const TableDeclaration& got = mine.tables(i);
    if (got.name() != expected.name() || got.dim() != expected.dim()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "embedding table ", i, " is '", got.name(), "' of dim ", got.dim(), " here but '",
          expected.name(), "' of dim ", expected.dim(), " in ", theirs));
    }
    if (SettingsText(got) != SettingsText(expected)) {
      return absl::FailedPreconditionError(
          absl::StrCat("embedding table '", got.name(), "' has settings ", SettingsText(got),
                       " here but ", SettingsText(expected), " in ", theirs));
    }
  }
  return absl::OkStatus();
}

}  // namespace paramserver
