// A torch job's model kept beside its checkpoints, so that a new job can resume from
// them after the whole cluster was lost: the scheduler records the first worker's
// ModelDeclaration in checkpoint.dir when it accepts it, and a job with
// checkpoint.resume reads it back before any worker declares (the resume step and the
// shards' layout come from it; each worker's declaration must equal it).
#ifndef PARAMSERVER_SCHEDULER_RESUMED_MODEL_H_
#define PARAMSERVER_SCHEDULER_RESUMED_MODEL_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/scheduler.pb.h"

namespace paramserver {

// The file's name in checkpoint.dir (ListShardCheckpoints and the retention pass skip
// it: it is no shard's).
inline constexpr char kModelDeclarationFile[] = "model.declaration";

// Writes `model` (binary ModelDeclaration) to DIR/model.declaration, atomically, on
// this machine or S3. The write's error, naming the path.
absl::Status SaveModelDeclaration(const std::string& dir, const ModelDeclaration& model);

// The declaration in DIR/model.declaration, checked as a worker's is
// (LayoutOfDeclaration). NOT_FOUND when it is missing (checkpoints written before it
// was kept, or by an mlp or ctr job); DATA_LOSS when it is not a declaration;
// INVALID_ARGUMENT when it declares no valid model. Each names the path.
absl::StatusOr<ModelDeclaration> LoadModelDeclaration(const std::string& dir);

}  // namespace paramserver

#endif  // PARAMSERVER_SCHEDULER_RESUMED_MODEL_H_
