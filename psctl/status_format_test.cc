#include "psctl/status_format.h"

#include "catch2/catch.hpp"

namespace paramserver {
namespace {

ClusterStatus Example() {
  ClusterStatus status;
  status.set_verdict("training");
  status.set_map_version(3);
  status.set_mode("sync");
  status.set_replication(2);
  NodeStatus* server = status.add_nodes();
  server->set_name("ps-0");
  server->set_role(NODE_ROLE_SERVER);
  server->set_address("10.0.0.1:7001");
  server->set_health(NODE_HEALTH_SUSPECT);
  server->set_seconds_since_heartbeat(1.26);
  server->set_refused_gradients(3);
  NodeStatus* worker = status.add_nodes();
  worker->set_name("worker-10");
  worker->set_role(NODE_ROLE_WORKER);
  worker->set_address("10.0.0.2:7002");
  worker->set_health(NODE_HEALTH_ALIVE);
  worker->mutable_progress()->set_step(812);
  worker->mutable_progress()->set_loss(0.45213);
  worker->mutable_progress()->set_samples_per_sec(7600.4);
  status.set_fastest_step(812);
  status.set_slowest_step(798);
  status.set_slowest_worker("worker-3");
  status.set_samples_per_sec(15230);
  ShardStatusView* shard = status.add_shards();
  shard->set_shard_id(0);
  shard->set_primary("ps-0");
  shard->add_backups("ps-1");
  shard->add_backups("ps-2");
  shard->set_parameters(12722);
  shard->set_applied_updates(812);
  shard->set_checkpoint_step(800);
  ShardStatusView* bare = status.add_shards();
  bare->set_shard_id(1);
  bare->set_primary("ps-1");
  bare->set_checkpoint_step(-1);
  return status;
}

TEST_CASE("tables align every column to its widest cell") {
  CHECK(FormatTable({{"A", "BB", "C"}, {"long", "x", ""}}) == "A     BB  C\nlong  x\n");
}

TEST_CASE("the node table shows health, heartbeat age, worker progress and refused gradients") {
  CHECK(
      FormatNodes(Example()) ==
      "NODE       ROLE    ADDRESS        HEALTH   LAST HEARTBEAT  STEP  EPOCH  LOSS    SAMPLES/S  "
      "REFUSED GRADIENTS\n"
      "ps-0       server  10.0.0.1:7001  suspect  1.3 s ago                                       "
      "3\n"
      "worker-10  worker  10.0.0.2:7002  alive    0.0 s ago       812   0      0.4521  7600\n");
}

TEST_CASE("the shard table lists primaries and backups") {
  CHECK(FormatShards(Example()) ==
        "SHARD  PRIMARY  BACKUPS    PARAMETERS  APPLIED  CHECKPOINT\n"
        "0      ps-0     ps-1,ps-2  12722       812      800\n"
        "1      ps-1     -          0           0        -\n");
}

TEST_CASE("with tables, the shard table shows each embedding shard's rows and their cost") {
  ClusterStatus status = Example();
  ShardStatusView* rows = status.add_shards();
  rows->set_shard_id(2);
  rows->set_primary("ps-0");
  rows->set_applied_updates(812);
  rows->set_checkpoint_step(800);
  rows->set_embedding_rows(true);
  rows->set_embedding_bucket(0);
  rows->set_embedding_buckets(8);
  rows->mutable_embedding()->set_rows(1000);
  rows->mutable_embedding()->set_bytes(254000);
  rows->mutable_embedding()->set_minimum_bytes(192000);
  rows->mutable_embedding()->set_evicted_rows(5);
  rows->mutable_embedding()->set_dropped_gradients(17);
  CHECK(FormatShards(status) ==
        "SHARD  PRIMARY  BACKUPS    PARAMETERS  APPLIED  CHECKPOINT  HOLDS       ROWS  "
        "BYTES/ROW      EVICTED  DROPPED\n"
        "0      ps-0     ps-1,ps-2  12722       812      800         dense       -     -"
        "              -        -\n"
        "1      ps-1     -          0           0        -           dense       -     -"
        "              -        -\n"
        "2      ps-0     -          -           812      800         bucket 0/8  1000  "
        "254 (min 192)  5        17\n");
}

TEST_CASE(
    "late pushes (backup workers) are shown, the most any shard dropped, once there are "
    "some") {
  ClusterStatus status = Example();
  CHECK(FormatStatus(status).find("late pushes") == std::string::npos);
  status.mutable_shards(0)->set_late_pushes(7);
  status.mutable_shards(1)->set_late_pushes(9);
  CHECK(FormatStatus(status).find("late pushes: 9 (the most any shard dropped: their sync step "
                                  "completed without them, training.sync.backup_workers)") !=
        std::string::npos);
}

TEST_CASE("steps a loss scaler skipped are counted in the status, only once there are some") {
  ClusterStatus status = Example();
  CHECK(FormatStatus(status).find("skipped steps") == std::string::npos);
  status.mutable_shards(0)->set_skipped_steps(3);
  status.mutable_shards(1)->set_skipped_steps(3);
  CHECK(FormatStatus(status).find("skipped steps: 3 (a worker's loss scaler found the step's "
                                  "gradient not finite)\n") != std::string::npos);
}

TEST_CASE("a workers range: the status says how many train and the effective batch") {
  ClusterStatus status = Example();
  CHECK(FormatStatus(status).find("live of cluster.workers") == std::string::npos);
  status.set_live_workers(3);
  status.set_min_workers(2);
  status.set_max_workers(8);
  status.set_effective_batch(96);
  CHECK(FormatStatus(status).find("workers: 3 live of cluster.workers 2..8; effective batch 96 "
                                  "(each step's mean)\n") != std::string::npos);
}

TEST_CASE("the status shows the data lease table only for dynamic data") {
  ClusterStatus status = Example();
  CHECK(FormatStatus(status).find("data leases") == std::string::npos);
  DataLeaseTableState* leases = status.mutable_data_leases();
  leases->set_example_count(1005);
  leases->set_batch_size(10);
  leases->set_epochs(2);
  leases->set_epoch(1);
  leases->set_frontier(200);
  leases->add_trained_examples(1000);
  leases->add_trained_examples(150);
  leases->set_handed_back(1);
  DataPiece* held = leases->add_pieces();
  held->set_epoch(1);
  held->set_begin(150);
  held->set_end(200);
  held->set_lease_id(9);
  held->set_rank(1);
  held->set_first_step(60);
  held->set_fenced_at_epoch(7);
  DataPiece* waiting = leases->add_pieces();
  waiting->set_epoch(0);
  waiting->set_begin(990);
  waiting->set_end(1000);
  const std::string text = FormatStatus(status);
  CHECK(text.find("data leases: epoch 1 of 2, 200 of 1000 examples leased; trained per epoch: "
                  "1000, 150 of 1000; 1 piece(s) handed back\n") != std::string::npos);
  CHECK(text.find("  epoch 1 [150, 200): lease 9 to worker-1 from step 60, settling (its worker "
                  "was lost at map 7)\n") != std::string::npos);
  CHECK(text.find("  epoch 0 [990, 1000): waiting for a worker\n") != std::string::npos);
}

TEST_CASE("a ctr model's status speaks of AUC and log loss") {
  ClusterStatus status = Example();
  status.set_test_metric("AUC");
  status.mutable_nodes(1)->mutable_progress()->set_test_auc(0.7345);
  status.mutable_nodes(1)->mutable_progress()->set_accuracy_step(780);
  CHECK(FormatStatus(status).find("last test AUC 0.7345 at step 780 (worker-10)") !=
        std::string::npos);
  status.set_has_result(true);
  status.set_test_accuracy(0.7712);
  status.set_test_logloss(0.4611);
  CHECK(FormatStatus(status).find("final test AUC 0.7712, log loss 0.4611\n") != std::string::npos);
}

TEST_CASE("the status starts with the verdict and says how far the slowest worker lags") {
  const std::string text = FormatStatus(Example());
  CHECK(text.rfind("training\nmap version 3, mode sync, replication 2\n", 0) == 0);
  CHECK(text.find("ETA") == std::string::npos);  // no total reported yet
  CHECK(text.find("slowest worker-3 at step 798 (14 behind); 15230 samples/s in all") !=
        std::string::npos);
  CHECK(text.find("ps-0       server") != std::string::npos);
  CHECK(HealthName(NODE_HEALTH_DEAD) == "dead");
  CHECK(text.find("last test accuracy") == std::string::npos);  // no evaluation yet
  ClusterStatus evaluated = Example();
  evaluated.mutable_nodes(1)->mutable_progress()->set_test_accuracy(0.8123);
  evaluated.mutable_nodes(1)->mutable_progress()->set_accuracy_step(937);
  CHECK(FormatStatus(evaluated).find("last test accuracy 0.8123 at step 937 (worker-10)\n") !=
        std::string::npos);
}

TEST_CASE("the progress line counts the slowest worker's steps against the total, with an ETA") {
  ClusterStatus status = Example();
  CHECK(FormatProgress(status).empty());
  status.set_total_steps(3750);
  status.set_eta_seconds(-1);
  CHECK(FormatProgress(status) == "step 798 of 3750 (21%), ETA not known yet");
  status.set_eta_seconds(130.4);
  CHECK(FormatProgress(status) == "step 798 of 3750 (21%), ETA 2 min 10 s");
  CHECK(FormatStatus(status).find("replication 2\nstep 798 of 3750 (21%), ETA 2 min 10 s\n") !=
        std::string::npos);
  status.set_has_result(true);
  status.set_elapsed_seconds(7385);
  CHECK(FormatProgress(status) == "step 3750 of 3750 (100%), done in 2 h 03 min");
  CHECK(FormatDuration(59.4) == "59 s");
  CHECK(FormatDuration(60) == "1 min 00 s");
}

TEST_CASE(
    "a server whose checkpoints fail is named with the step they began failing at and the error") {
  CHECK(FormatStatus(Example()).find("checkpoints failing") == std::string::npos);
  ClusterStatus failing = Example();
  CheckpointTrouble* trouble = failing.mutable_nodes(0)->mutable_checkpoint_trouble();
  trouble->set_failing_since_step(100);
  trouble->set_failed_writes(3);
  trouble->set_error("write /ckpt/shard-0-step-100.ckpt.tmp.7: No space left on device");
  CHECK(FormatStatus(failing).find(
            "checkpoints failing on ps-0 since step 100 (3 writes): write "
            "/ckpt/shard-0-step-100.ckpt.tmp.7: No space left on device\n") != std::string::npos);
}

}  // namespace
}  // namespace paramserver
