#include "scheduler/heartbeat_validation.h"

#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "catch2/catch.hpp"

namespace paramserver {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

// A server's and a worker's figures at once, all in range.
HeartbeatRequest GoodHeartbeat() {
  HeartbeatRequest beat;
  beat.set_node_name("worker-1");
  NodeProgress* progress = beat.mutable_progress();
  progress->set_step(120);
  progress->set_epoch(2);
  progress->set_loss(-0.5);  // a script's loss may be negative
  progress->set_samples_per_sec(1e5);
  progress->set_test_accuracy(1);
  progress->set_accuracy_step(100);
  progress->set_total_steps(1000);
  progress->set_steps_per_sec(30);
  progress->set_test_auc(0.7);
  progress->set_test_logloss(0.45);
  beat.set_serving_epoch(3);
  ShardStatus* shard = beat.add_shards();
  shard->set_shard_id(0);
  shard->set_applied_updates(7);
  shard->set_checkpoint_step(-1);
  shard->mutable_embedding()->set_rows(10);
  shard->mutable_embedding()->set_bytes(4096);
  beat.mutable_checkpoint_trouble()->set_failing_since_step(-1);
  return beat;
}

struct BadField {
  std::string message;  // what the refusal says
  std::function<void(HeartbeatRequest&)> spoil;
};

TEST_CASE("a heartbeat with every figure in range is accepted, an empty one too") {
  CHECK(ValidateHeartbeat(GoodHeartbeat()).ok());
  CHECK(ValidateHeartbeat(HeartbeatRequest()).ok());
}

TEST_CASE("each numeric field out of range is refused, naming the field and its value") {
  using H = HeartbeatRequest;
  const std::vector<BadField> bad = {
      {"progress.step is -1 (must be >= 0)", [](H& h) { h.mutable_progress()->set_step(-1); }},
      {"progress.epoch is -2 (must be >= 0)", [](H& h) { h.mutable_progress()->set_epoch(-2); }},
      {"progress.loss is nan (must be finite)", [](H& h) { h.mutable_progress()->set_loss(kNaN); }},
      {"progress.loss is -inf (must be finite)",
       [](H& h) { h.mutable_progress()->set_loss(-kInf); }},
      {"progress.samples_per_sec is inf (must be finite, >= 0)",
       [](H& h) { h.mutable_progress()->set_samples_per_sec(kInf); }},
      {"progress.samples_per_sec is -3 (must be finite, >= 0)",
       [](H& h) { h.mutable_progress()->set_samples_per_sec(-3); }},
      {"progress.test_accuracy is 42 (must be in [0, 1])",
       [](H& h) { h.mutable_progress()->set_test_accuracy(42); }},
      {"progress.test_accuracy is nan (must be in [0, 1])",
       [](H& h) { h.mutable_progress()->set_test_accuracy(kNaN); }},
      {"progress.accuracy_step is -1 (must be >= 0)",
       [](H& h) { h.mutable_progress()->set_accuracy_step(-1); }},
      {"progress.total_steps is -5 (must be >= 0)",
       [](H& h) { h.mutable_progress()->set_total_steps(-5); }},
      {"progress.steps_per_sec is nan (must be finite, >= 0)",
       [](H& h) { h.mutable_progress()->set_steps_per_sec(kNaN); }},
      {"progress.test_auc is 1.5 (must be in [0, 1])",
       [](H& h) { h.mutable_progress()->set_test_auc(1.5); }},
      {"progress.test_auc is -0.1 (must be in [0, 1])",
       [](H& h) { h.mutable_progress()->set_test_auc(-0.1); }},
      {"progress.test_logloss is inf (must be finite, >= 0)",
       [](H& h) { h.mutable_progress()->set_test_logloss(kInf); }},
      {"progress.test_logloss is -1 (must be finite, >= 0)",
       [](H& h) { h.mutable_progress()->set_test_logloss(-1); }},
      {"serving_epoch is -1 (must be >= 0)", [](H& h) { h.set_serving_epoch(-1); }},
      {"shards[0].shard_id is -4 (must be >= 0)",
       [](H& h) { h.mutable_shards(0)->set_shard_id(-4); }},
      {"shards[0].applied_updates is -1 (must be >= 0)",
       [](H& h) { h.mutable_shards(0)->set_applied_updates(-1); }},
      {"shards[0].checkpoint_step is -2 (must be >= -1)",
       [](H& h) { h.mutable_shards(0)->set_checkpoint_step(-2); }},
      {"shards[0].embedding.rows is -1 (must be >= 0)",
       [](H& h) { h.mutable_shards(0)->mutable_embedding()->set_rows(-1); }},
      {"shards[0].embedding.bytes is nan (must be finite, >= 0)",
       [](H& h) { h.mutable_shards(0)->mutable_embedding()->set_bytes(kNaN); }},
      {"shards[0].embedding.bytes is inf (must be finite, >= 0)",
       [](H& h) { h.mutable_shards(0)->mutable_embedding()->set_bytes(kInf); }},
      {"shards[0].embedding.minimum_bytes is -1 (must be >= 0)",
       [](H& h) { h.mutable_shards(0)->mutable_embedding()->set_minimum_bytes(-1); }},
      {"shards[0].embedding.evicted_rows is -1 (must be >= 0)",
       [](H& h) { h.mutable_shards(0)->mutable_embedding()->set_evicted_rows(-1); }},
      {"shards[0].embedding.dropped_gradients is -1 (must be >= 0)",
       [](H& h) { h.mutable_shards(0)->mutable_embedding()->set_dropped_gradients(-1); }},
      {"shards[0].embedding.pending_ids is -1 (must be >= 0)",
       [](H& h) { h.mutable_shards(0)->mutable_embedding()->set_pending_ids(-1); }},
      {"checkpoint_trouble.failing_since_step is -2 (must be >= -1)",
       [](H& h) { h.mutable_checkpoint_trouble()->set_failing_since_step(-2); }},
      {"checkpoint_trouble.failed_writes is -1 (must be >= 0)",
       [](H& h) { h.mutable_checkpoint_trouble()->set_failed_writes(-1); }},
      {"checkpoint_trouble.error is 4097 bytes (at most 4096)",
       [](H& h) { h.mutable_checkpoint_trouble()->set_error(std::string(4097, 'e')); }},
      {"refused_gradients is -1 (must be >= 0)", [](H& h) { h.set_refused_gradients(-1); }},
      {"shard_map_conflicts is -3 (must be >= 0)", [](H& h) { h.set_shard_map_conflicts(-3); }},
      {"last_shard_map_conflict is 4097 bytes (at most 4096)",
       [](H& h) { h.set_last_shard_map_conflict(std::string(4097, 'c')); }},
  };
  for (const BadField& field : bad) {
    INFO(field.message);
    HeartbeatRequest beat = GoodHeartbeat();
    field.spoil(beat);
    const absl::Status refused = ValidateHeartbeat(beat);
    CHECK(refused.code() == absl::StatusCode::kInvalidArgument);
    CHECK(refused.message() == "heartbeat from worker-1: " + field.message);
  }
}

TEST_CASE("a bad figure in a later shard is named by its index; too many shards are refused") {
  HeartbeatRequest beat = GoodHeartbeat();
  *beat.add_shards() = beat.shards(0);
  beat.mutable_shards(1)->set_applied_updates(-9);
  CHECK(ValidateHeartbeat(beat).message() ==
        "heartbeat from worker-1: shards[1].applied_updates is -9 (must be >= 0)");
  HeartbeatRequest many;
  for (int i = 0; i <= kMaxHeartbeatShards; ++i) many.add_shards()->set_shard_id(i);
  CHECK(ValidateHeartbeat(many).code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("a long node name is not echoed into the refusal") {
  HeartbeatRequest beat = GoodHeartbeat();
  beat.set_node_name(std::string(1000, 'n'));
  beat.mutable_progress()->set_loss(kNaN);
  CHECK(ValidateHeartbeat(beat).message() ==
        "heartbeat from a node: progress.loss is nan (must be finite)");
}

}  // namespace
}  // namespace paramserver
