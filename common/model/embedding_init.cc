#include "common/model/embedding_init.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace paramserver {
namespace {

// "C<k>.ids" or "C<k>.weight" -> k (1-based) and which; false for other names.
bool ParseTableTensorName(const std::string& name, int* table, bool* ids) {
  const size_t dot = name.find('.');
  if (name.size() < 3 || name[0] != 'C' || dot == std::string::npos) return false;
  const std::string suffix = name.substr(dot + 1);
  if (suffix != "ids" && suffix != "weight") return false;
  if (!absl::SimpleAtoi(name.substr(1, dot - 1), table)) return false;
  *ids = suffix == "ids";
  return true;
}

}  // namespace

std::string TableName(int table_index) { return absl::StrCat("C", table_index + 1); }

absl::StatusOr<std::vector<TableRows>> EmbeddingRowsFromTensors(
    const std::vector<NamedTensor>& tensors, const std::vector<int>& dims,
    const std::string& source) {
  const int tables = static_cast<int>(dims.size());
  std::vector<const NamedTensor*> ids_of(tables, nullptr), weight_of(tables, nullptr);
  for (const NamedTensor& tensor : tensors) {
    int table = 0;
    bool is_ids = false;
    if (!ParseTableTensorName(tensor.name, &table, &is_ids)) continue;
    if (table < 1 || table > tables) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": tensor '", tensor.name, "' is for table C", table,
                       ", which the model lacks (its tables are C1..C", tables, ")"));
    }
    (is_ids ? ids_of : weight_of)[table - 1] = &tensor;
  }
  std::vector<TableRows> result(tables);
  for (int t = 0; t < tables; ++t) {
    const std::string name = TableName(t);
    const NamedTensor* ids = ids_of[t];
    const NamedTensor* weight = weight_of[t];
    const int dim = dims[t];
    if (ids == nullptr && weight == nullptr) continue;
    if (ids == nullptr || weight == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": ", name, ".",
                                                     ids == nullptr ? "ids" : "weight",
                                                     " is missing; a table's rows need both"));
    }
    if (ids->dtype != TensorDtype::kI64 || ids->shape.size() != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": ", name, ".ids must be I64 of shape [n], it is ",
                       ids->dtype == TensorDtype::kI64 ? "I64" : "F32", " [",
                       absl::StrJoin(ids->shape, ", "), "]"));
    }
    const int64_t n = ids->shape[0];
    if (weight->dtype != TensorDtype::kF32 ||
        weight->shape != std::vector<int64_t>{n, static_cast<int64_t>(dim)}) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": ", name, ".weight must be F32 [", n, ", ", dim, "] for its ", n,
                       " ids, it is ", weight->dtype == TensorDtype::kF32 ? "F32" : "I64", " [",
                       absl::StrJoin(weight->shape, ", "), "]"));
    }
    std::vector<size_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(),
              [&](size_t a, size_t b) { return ids->int_values[a] < ids->int_values[b]; });
    TableRows& rows = result[t];
    rows.ids.reserve(n);
    rows.rows.reserve(n * dim);
    for (size_t i : order) {
      if (!rows.ids.empty() && rows.ids.back() == ids->int_values[i]) {
        return absl::InvalidArgumentError(
            absl::StrCat(source, ": ", name, ".ids holds id ", ids->int_values[i], " twice"));
      }
      rows.ids.push_back(ids->int_values[i]);
      rows.rows.insert(rows.rows.end(), weight->values.begin() + i * dim,
                       weight->values.begin() + (i + 1) * dim);
    }
  }
  return result;
}

void SortTableRows(int dim, TableRows* table) {
  std::vector<size_t> order(table->ids.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return table->ids[a] < table->ids[b]; });
  TableRows sorted;
  sorted.ids.reserve(order.size());
  sorted.rows.reserve(table->rows.size());
  for (size_t i : order) {
    sorted.ids.push_back(table->ids[i]);
    sorted.rows.insert(sorted.rows.end(), table->rows.begin() + i * dim,
                       table->rows.begin() + (i + 1) * dim);
  }
  *table = std::move(sorted);
}

std::vector<NamedTensor> TensorsOfTables(const std::vector<TableRows>& tables,
                                         const std::vector<int>& dims) {
  std::vector<std::string> names;
  for (size_t t = 0; t < tables.size(); ++t) names.push_back(TableName(t));
  return TensorsOfTables(tables, names, dims);
}

std::vector<NamedTensor> TensorsOfTables(const std::vector<TableRows>& tables,
                                         const std::vector<std::string>& names,
                                         const std::vector<int>& dims) {
  std::vector<NamedTensor> tensors;
  for (size_t t = 0; t < tables.size(); ++t) {
    const int64_t n = static_cast<int64_t>(tables[t].ids.size());
    NamedTensor ids{names[t] + ".ids", {n}, {}, TensorDtype::kI64, tables[t].ids};
    NamedTensor weight{names[t] + ".weight", {n, dims[t]}, tables[t].rows};
    tensors.push_back(std::move(ids));
    tensors.push_back(std::move(weight));
  }
  return tensors;
}

}  // namespace paramserver
