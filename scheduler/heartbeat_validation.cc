#include "scheduler/heartbeat_validation.h"

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"

namespace paramserver {
namespace {

// Collects the first bad field of one heartbeat.
class HeartbeatChecker {
 public:
  explicit HeartbeatChecker(const HeartbeatRequest& heartbeat) : heartbeat_(heartbeat) {}

  void Finite(const std::string& field, double value) {
    if (!std::isfinite(value)) Fail(field, absl::StrCat(value), "must be finite");
  }
  void FiniteAtLeastZero(const std::string& field, double value) {
    if (!std::isfinite(value) || value < 0)
      Fail(field, absl::StrCat(value), "must be finite, >= 0");
  }
  void Fraction(const std::string& field, double value) {
    if (!(value >= 0 && value <= 1)) Fail(field, absl::StrCat(value), "must be in [0, 1]");
  }
  void AtLeast(const std::string& field, int64_t value, int64_t minimum) {
    if (value < minimum) Fail(field, absl::StrCat(value), absl::StrCat("must be >= ", minimum));
  }
  void Fail(const std::string& field, const std::string& value, const std::string& rule) {
    if (!status_.ok()) return;
    const std::string& node = heartbeat_.node_name();
    status_ = absl::InvalidArgumentError(absl::StrCat("heartbeat from ",
                                                      node.size() <= 64 ? node : "a node", ": ",
                                                      field, " is ", value, " (", rule, ")"));
  }
  absl::Status status() const { return status_; }

 private:
  const HeartbeatRequest& heartbeat_;
  absl::Status status_;
};

}  // namespace

absl::Status ValidateHeartbeat(const HeartbeatRequest& heartbeat) {
  HeartbeatChecker check(heartbeat);
  const NodeProgress& progress = heartbeat.progress();
  check.AtLeast("progress.step", progress.step(), 0);
  check.AtLeast("progress.epoch", progress.epoch(), 0);
  check.Finite("progress.loss", progress.loss());
  check.FiniteAtLeastZero("progress.samples_per_sec", progress.samples_per_sec());
  check.Fraction("progress.test_accuracy", progress.test_accuracy());
  check.AtLeast("progress.accuracy_step", progress.accuracy_step(), 0);
  check.AtLeast("progress.total_steps", progress.total_steps(), 0);
  check.FiniteAtLeastZero("progress.steps_per_sec", progress.steps_per_sec());
  check.Fraction("progress.test_auc", progress.test_auc());
  check.FiniteAtLeastZero("progress.test_logloss", progress.test_logloss());
  check.AtLeast("serving_epoch", heartbeat.serving_epoch(), 0);
  if (heartbeat.shards_size() > kMaxHeartbeatShards) {
    check.Fail("shards", absl::StrCat(heartbeat.shards_size(), " entries"),
               absl::StrCat("at most ", kMaxHeartbeatShards));
  }
  for (int i = 0; i < heartbeat.shards_size(); ++i) {
    const ShardStatus& shard = heartbeat.shards(i);
    const std::string at = absl::StrCat("shards[", i, "].");
    check.AtLeast(at + "shard_id", shard.shard_id(), 0);
    check.AtLeast(at + "applied_updates", shard.applied_updates(), 0);
    check.AtLeast(at + "skipped_steps", shard.skipped_steps(), 0);
    check.AtLeast(at + "late_pushes", shard.late_pushes(), 0);
    check.AtLeast(at + "checkpoint_step", shard.checkpoint_step(), -1);
    const EmbeddingShardStats& embedding = shard.embedding();
    check.AtLeast(at + "embedding.rows", embedding.rows(), 0);
    check.FiniteAtLeastZero(at + "embedding.bytes", embedding.bytes());
    check.AtLeast(at + "embedding.minimum_bytes", embedding.minimum_bytes(), 0);
    check.AtLeast(at + "embedding.evicted_rows", embedding.evicted_rows(), 0);
    check.AtLeast(at + "embedding.dropped_gradients", embedding.dropped_gradients(), 0);
    check.AtLeast(at + "embedding.pending_ids", embedding.pending_ids(), 0);
    if (!check.status().ok()) break;
  }
  const CheckpointTrouble& trouble = heartbeat.checkpoint_trouble();
  check.AtLeast("checkpoint_trouble.failing_since_step", trouble.failing_since_step(), -1);
  check.AtLeast("checkpoint_trouble.failed_writes", trouble.failed_writes(), 0);
  if (trouble.error().size() > kMaxCheckpointErrorBytes) {
    check.Fail("checkpoint_trouble.error", absl::StrCat(trouble.error().size(), " bytes"),
               absl::StrCat("at most ", kMaxCheckpointErrorBytes));
  }
  if (heartbeat.worker_next_steps_size() > kMaxHeartbeatWorkers) {
    check.Fail("worker_next_steps", absl::StrCat(heartbeat.worker_next_steps_size(), " entries"),
               absl::StrCat("at most ", kMaxHeartbeatWorkers));
  }
  for (int i = 0; i < heartbeat.worker_next_steps_size() && check.status().ok(); ++i) {
    const int64_t step = heartbeat.worker_next_steps(i);
    if (step < 0 || step > kMaxHeartbeatStep) {
      check.Fail(absl::StrCat("worker_next_steps[", i, "]"), absl::StrCat(step),
                 "must be 0 to 2^53");
    }
  }
  check.AtLeast("refused_gradients", heartbeat.refused_gradients(), 0);
  check.AtLeast("shard_map_conflicts", heartbeat.shard_map_conflicts(), 0);
  if (heartbeat.last_shard_map_conflict().size() > kMaxCheckpointErrorBytes) {
    check.Fail("last_shard_map_conflict",
               absl::StrCat(heartbeat.last_shard_map_conflict().size(), " bytes"),
               absl::StrCat("at most ", kMaxCheckpointErrorBytes));
  }
  return check.status();
}

}  // namespace paramserver
