// A user's model (model.type torch) as it travels: the first worker declares its
// tensors and embedding tables to the scheduler (ModelDeclaration), which places the
// shards from it and hands it to the servers in the shard map. This converts a
// declaration to a ModelLayout and back, validating what a peer sent, and says where
// two declarations differ.
#ifndef PARAMSERVER_COMMON_MODEL_MODEL_DECLARATION_H_
#define PARAMSERVER_COMMON_MODEL_MODEL_DECLARATION_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model/model_layout.h"
#include "proto/scheduler.pb.h"

namespace paramserver {

// What a declaration may hold: enough for any model one job trains, small enough that a
// peer cannot make the scheduler allocate without bound, and that a declaration at
// every cap fits the scheduler's message limit (kMaxSchedulerMessageBytes: about
// 2.8 MiB at these caps; 2^16 tensors would need over 20 MiB).
inline constexpr int kMaxDeclaredTensors = 1 << 13;
inline constexpr int kMaxDeclaredTables = 1024;
inline constexpr int kMaxDeclaredRank = 8;  // dimensions of one tensor
inline constexpr size_t kMaxDeclaredNameBytes = 256;
inline constexpr int64_t kMaxDeclaredParameters = int64_t{1} << 36;  // 256 GiB of float32
inline constexpr int64_t kMaxDeclaredTableDim = 1 << 16;

// The layout of `declaration` (tensors back to back in its order). INVALID_ARGUMENT
// naming the tensor or table for an empty, over-long or repeated name, a dimension < 1,
// too many dimensions, tensors, tables or parameters, a table dim outside
// [1, kMaxDeclaredTableDim], a table setting out of range (naming its key), or a model
// with neither tensors nor tables.
absl::StatusOr<ModelLayout> LayoutOfDeclaration(const ModelDeclaration& declaration);

// The declaration that LayoutOfDeclaration turns back into `layout`.
ModelDeclaration DeclarationOf(const ModelLayout& layout);

// OK when `mine` declares exactly the job's model; otherwise FAILED_PRECONDITION naming
// the first tensor or table that differs (missing, extra, another shape, order, dim or
// table settings),
// e.g. "tensor 'fc.weight' has shape [10, 64] here but [10, 128] in the job's model
// (declared by worker-0)".
absl::Status CheckSameModel(const ModelDeclaration& job, const ModelDeclaration& mine,
                            const std::string& declared_by);

}  // namespace paramserver

#endif  // PARAMSERVER_COMMON_MODEL_MODEL_DECLARATION_H_
