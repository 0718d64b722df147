#include "tests/cluster_config.h"

#include "absl/strings/str_cat.h"

namespace paramserver {

std::string TestJobYaml(const TestJob& job) {
  return absl::StrCat(R"(cluster:
  scheduler: 127.0.0.1:0
  servers: )",
                      job.max_servers > job.servers
                          ? absl::StrCat("{min: ", job.servers, ", max: ", job.max_servers, "}")
                          : absl::StrCat(job.servers),
                      R"(
  workers: )",
                      job.max_workers > job.workers
                          ? absl::StrCat("{min: ", job.workers, ", max: ", job.max_workers, "}")
                          : absl::StrCat(job.workers),
                      R"(
  shards: )",
                      job.shards, R"(
  replication: )",
                      job.replication > 0 ? job.replication : (job.servers >= 2 ? 2 : 1), R"(
  heartbeat_interval_ms: )",
                      job.heartbeat_interval_ms, R"(
  failure_timeout_ms: )",
                      job.failure_timeout_ms, "\n",
                      job.no_worker_timeout_ms > 0
                          ? absl::StrCat("  no_worker_timeout_ms: ", job.no_worker_timeout_ms, "\n")
                          : "",
                      R"(model:
  layers: [784, 128, 10]
  init_seed: 1
training:
  mode: )",
                      job.mode, R"(
  staleness: )",
                      job.staleness, R"(
  batch_size: 32
  epochs: )",
                      job.epochs, R"(
  max_steps: )",
                      job.max_steps, R"(
  shuffle: )",
                      job.shuffle ? "true" : "false", R"(
  seed: 1
  overlap: )",
                      job.overlap ? "true" : "false", R"(
  push_bucket_kb: )",
                      job.push_bucket_kb, R"(
  sync: {backup_workers: )",
                      job.backup_workers, R"(}
  optimizer: )",
                      job.optimizer, "\n",
                      job.data_sharding.empty()
                          ? ""
                          : absl::StrCat("data:\n  sharding: ", job.data_sharding,
                                         "\n  chunk_batches: ", job.chunk_batches, "\n"),
                      R"(checkpoint:
  dir: ")",
                      job.checkpoint_dir, R"("
  every_steps: )",
                      job.checkpoint_every_steps, R"(
  resume: )",
                      job.resume ? "true" : "false", R"(
security:
  admin_token_file: ")",
                      job.admin_token_file, R"("
  cluster_token_file: ")",
                      job.cluster_token_file, R"("
  tls: {ca: ")",
                      job.tls_ca, R"(", cert: ")", job.tls_cert, R"(", key: ")", job.tls_key,
                      R"(", server_name: ")", job.tls_server_name, R"("}
output:
  weights: ")",
                      job.weights, R"("
  tensorboard_dir: ")",
                      job.tensorboard_dir, R"("
  report: ")",
                      job.report, R"("
)");
}

}  // namespace paramserver
