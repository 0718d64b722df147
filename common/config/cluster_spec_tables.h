// The embedding tables' settings in the cluster spec: training.embedding_optimizer and a
// ctr model's model.tables (each table's dim, capacity and row optimizer). Part of
// cluster_spec; its callers use that.
#ifndef PARAMSERVER_COMMON_CONFIG_CLUSTER_SPEC_TABLES_H_
#define PARAMSERVER_COMMON_CONFIG_CLUSTER_SPEC_TABLES_H_

#include "absl/status/status.h"
#include "common/config/cluster_spec.h"
#include "common/config/yaml_map_reader.h"

namespace paramserver {

// Reads an embedding optimizer's section into `optimizer`. Its type is `type` (unset:
// `inherit`'s type, or adam without one); with `inherit`'s type every key left out is
// `inherit`'s, otherwise that type's default. INVALID_ARGUMENT naming the key (and its
// line) for an unknown type, a key of another type, an unknown key or a value out of
// range. `inherit` may be null (training.embedding_optimizer itself).
absl::Status ParseEmbeddingOptimizer(YamlMapReader& r, const EmbeddingOptimizerOptions* inherit,
                                     EmbeddingOptimizerOptions* optimizer);

// Reads model.tables (`tables`, a mapping of table name to its settings) for a ctr
// model, filling model->tables (C1..C<categorical_features>) and, unless `model_reader`'s
// layers were given, model->layers; then checks model.layers against the tables' dims.
// The tables' optimizers inherit `job_optimizer` (training.embedding_optimizer).
// INVALID_ARGUMENT naming the table and key for a table the model lacks, an unknown key
// or a value out of range.
absl::Status ParseCtrTables(YamlMapReader& tables, YamlMapReader& model_reader, bool layers_given,
                            const EmbeddingOptimizerOptions& job_optimizer, ModelSection* model);

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_CONFIG_CLUSTER_SPEC_TABLES_H_
