// The embedding rows a model's init_from file gives (safetensors, next to the dense
// tensors): per table C<k>, "C<k>.ids" (I64 [n]) and "C<k>.weight" (F32 [n, dim]), as
// output.weights and ps_checkpoint_export write them. Rows absent from the file take
// the default initial value.
#ifndef PARAMSERVER_COMMON_MODEL_EMBEDDING_INIT_H_
#define PARAMSERVER_COMMON_MODEL_EMBEDDING_INIT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/checkpoint/safetensors.h"

namespace paramserver {

// One table's given rows, ids ascending.
struct TableRows {
  std::vector<int64_t> ids;
  std::vector<float> rows;  // ids.size() x dim
};

// "C<k>" for table index k - 1.
std::string TableName(int table_index);

// The rows of tables C1..C<dims.size()> in `tensors` (a table without tensors has none),
// table t's rows dims[t] wide. INVALID_ARGUMENT naming `source` and the tensor for: a
// table the model lacks (C0, C<dims.size() + 1>, ...), ids that are not I64 or not
// one-dimensional, a weight that is not F32 [n, dim] for n ids, one of the pair without
// the other, or an id given twice.
absl::StatusOr<std::vector<TableRows>> EmbeddingRowsFromTensors(
    const std::vector<NamedTensor>& tensors, const std::vector<int>& dims,
    const std::string& source);

// Sorts a table's rows by id (rows gathered from several shards interleave).
void SortTableRows(int dim, TableRows* table);

// The tensors of `tables` (C<k>.ids, C<k>.weight), rows as given (sorted by id), table t's
// dims[t] wide. REQUIRES: dims has a value per table.
std::vector<NamedTensor> TensorsOfTables(const std::vector<TableRows>& tables,
                                         const std::vector<int>& dims);
// The same, table t named names[t] (<name>.ids, <name>.weight) with rows dims[t] wide.
// REQUIRES: names and dims have a value per table.
std::vector<NamedTensor> TensorsOfTables(const std::vector<TableRows>& tables,
                                         const std::vector<std::string>& names,
                                         const std::vector<int>& dims);

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_MODEL_EMBEDDING_INIT_H_
