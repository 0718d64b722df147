#include "psctl/status_format.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/ops/plain_json.h"

namespace paramserver {

std::string FormatTable(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> widths;
  for (const auto& row : rows) {
    if (widths.size() < row.size()) widths.resize(row.size(), 0);
    for (size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      line += row[c];
      if (c + 1 < row.size()) line += std::string(widths[c] - row[c].size() + 2, ' ');
    }
    line.erase(line.find_last_not_of(' ') + 1);
    absl::StrAppend(&out, line, "\n");
  }
  return out;
}

std::string HealthName(NodeHealth health) {
  return EnumWord(*NodeHealth_descriptor()->FindValueByNumber(health));
}

std::string FormatDuration(double seconds) {
  const int64_t whole = static_cast<int64_t>(std::llround(std::max(0.0, seconds)));
  if (whole < 60) return absl::StrCat(whole, " s");
  if (whole < 3600) return absl::StrFormat("%d min %02d s", whole / 60, whole % 60);
  return absl::StrFormat("%d h %02d min", whole / 3600, (whole % 3600) / 60);
}

std::string FormatProgress(const ClusterStatus& status) {
  if (status.total_steps() <= 0) return "";
  // The job is as far as its slowest live worker.
  const int64_t done = status.has_result() ? status.total_steps() : status.slowest_step();
  std::string out = absl::StrFormat("step %d of %d (%d%%)", done, status.total_steps(),
                                    100 * done / status.total_steps());
  if (status.has_result()) {
    absl::StrAppend(&out, ", done in ", FormatDuration(status.elapsed_seconds()));
  } else if (status.eta_seconds() < 0) {
    absl::StrAppend(&out, ", ETA not known yet");
  } else {
    absl::StrAppend(&out, ", ETA ", FormatDuration(status.eta_seconds()));
  }
  return out;
}

std::string FormatNodes(const ClusterStatus& status) {
  std::vector<std::vector<std::string>> rows = {{"NODE", "ROLE", "ADDRESS", "HEALTH",
                                                 "LAST HEARTBEAT", "STEP", "EPOCH", "LOSS",
                                                 "SAMPLES/S", "REFUSED GRADIENTS"}};
  for (const NodeStatus& node : status.nodes()) {
    const bool worker = node.role() == NODE_ROLE_WORKER;
    rows.push_back({node.name(), worker ? "worker" : "server", node.address(),
                    HealthName(node.health()),
                    absl::StrFormat("%.1f s ago", node.seconds_since_heartbeat()),
                    worker ? absl::StrCat(node.progress().step()) : "",
                    worker ? absl::StrCat(node.progress().epoch()) : "",
                    worker ? absl::StrFormat("%.4f", node.progress().loss()) : "",
                    worker ? absl::StrFormat("%.0f", node.progress().samples_per_sec()) : "",
                    worker ? "" : absl::StrCat(node.refused_gradients())});
  }
  return FormatTable(rows);
}

std::string FormatShards(const ClusterStatus& status) {
  const bool tables = std::any_of(status.shards().begin(), status.shards().end(),
                                  [](const ShardStatusView& s) { return s.embedding_rows(); });
  std::vector<std::vector<std::string>> rows = {
      {"SHARD", "PRIMARY", "BACKUPS", "PARAMETERS", "APPLIED", "CHECKPOINT"}};
  // A model with tables: each embedding shard's rows, bytes per row against the
  // minimum, and the capacity counts.
  if (tables) {
    for (const char* column : {"HOLDS", "ROWS", "BYTES/ROW", "EVICTED", "DROPPED"})
      rows[0].push_back(column);
  }
  for (const ShardStatusView& shard : status.shards()) {
    std::vector<std::string>& row = rows.emplace_back(std::vector<std::string>{
        absl::StrCat(shard.shard_id()), shard.primary(),
        shard.backups().empty() ? "-" : absl::StrJoin(shard.backups(), ","),
        shard.embedding_rows() ? "-" : absl::StrCat(shard.parameters()),
        absl::StrCat(shard.applied_updates()),
        shard.checkpoint_step() < 0 ? "-" : absl::StrCat(shard.checkpoint_step())});
    if (!tables) continue;
    if (!shard.embedding_rows()) {
      row.insert(row.end(), {"dense", "-", "-", "-", "-"});
      continue;
    }
    const EmbeddingShardStats& e = shard.embedding();
    const double per_row = e.rows() > 0 ? e.bytes() / e.rows() : 0;
    const double minimum = e.rows() > 0 ? static_cast<double>(e.minimum_bytes()) / e.rows() : 0;
    row.insert(row.end(),
               {absl::StrCat("bucket ", shard.embedding_bucket(), "/", shard.embedding_buckets()),
                absl::StrCat(e.rows()),
                e.rows() > 0 ? absl::StrFormat("%.0f (min %.0f)", per_row, minimum) : "-",
                absl::StrCat(e.evicted_rows()), absl::StrCat(e.dropped_gradients())});
  }
  return FormatTable(rows);
}

std::string FormatLeases(const DataLeaseTableState& leases) {
  // The scheduler's figures, not trusted to be sane: no division by zero.
  const int64_t batch = std::max<int64_t>(1, leases.batch_size());
  const int64_t usable = leases.example_count() / batch * batch;
  std::string out = "data leases: ";
  if (leases.epoch() >= leases.epochs()) {
    absl::StrAppend(&out, "every epoch leased");
  } else {
    absl::StrAppend(&out, "epoch ", leases.epoch(), " of ", leases.epochs(), ", ",
                    leases.frontier(), " of ", usable, " examples leased");
  }
  absl::StrAppend(&out, "; trained per epoch: ", absl::StrJoin(leases.trained_examples(), ", "),
                  " of ", usable, "; ", leases.handed_back(), " piece(s) handed back\n");
  constexpr int kMostShown = 12;
  int shown = 0;
  for (const DataPiece& piece : leases.pieces()) {
    if (++shown > kMostShown) {
      absl::StrAppend(&out, "  ... and ", leases.pieces_size() - kMostShown, " more\n");
      break;
    }
    absl::StrAppend(&out, "  epoch ", piece.epoch(), " [", piece.begin(), ", ", piece.end(), "): ");
    if (piece.lease_id() == 0) {
      absl::StrAppend(&out, "waiting for a worker\n");
    } else {
      absl::StrAppend(&out, "lease ", piece.lease_id(), " to worker-", piece.rank(), " from step ",
                      piece.first_step(),
                      piece.fenced_at_epoch() > 0
                          ? absl::StrCat(", settling (its worker was lost at map ",
                                         piece.fenced_at_epoch(), ")")
                          : "",
                      "\n");
    }
  }
  return out;
}

std::string FormatStatus(const ClusterStatus& status) {
  std::string out = absl::StrCat(status.verdict(), "\n");
  absl::StrAppend(&out, "map version ", status.map_version(), ", mode ", status.mode(),
                  ", replication ", status.replication(), "\n");
  if (const std::string progress = FormatProgress(status); !progress.empty())
    absl::StrAppend(&out, progress, "\n");
  if (!status.slowest_worker().empty()) {
    absl::StrAppend(&out, "workers: furthest at step ", status.fastest_step(), ", slowest ",
                    status.slowest_worker(), " at step ", status.slowest_step(), " (",
                    status.fastest_step() - status.slowest_step(), " behind); ",
                    absl::StrFormat("%.0f", status.samples_per_sec()), " samples/s in all\n");
  }
  if (status.max_workers() > status.min_workers()) {
    absl::StrAppend(&out, "workers: ", status.live_workers(), " live of cluster.workers ",
                    status.min_workers(), "..", status.max_workers());
    if (status.effective_batch() > 0)
      absl::StrAppend(&out, "; effective batch ", status.effective_batch(), " (each step's mean)");
    absl::StrAppend(&out, "\n");
  }
  int64_t skipped = 0;  // in sync mode every shard skips the same steps
  for (const ShardStatusView& shard : status.shards())
    skipped = std::max(skipped, shard.skipped_steps());
  if (skipped > 0) {
    absl::StrAppend(&out, "skipped steps: ", skipped,
                    " (a worker's loss scaler found the step's gradient not finite)\n");
  }
  int64_t late = 0;  // each shard drops a late push of its own
  for (const ShardStatusView& shard : status.shards()) late = std::max(late, shard.late_pushes());
  if (late > 0) {
    absl::StrAppend(&out, "late pushes: ", late,
                    " (the most any shard dropped: their sync step completed without "
                    "them, training.sync.backup_workers)\n");
  }
  const bool auc = status.test_metric() == "AUC";
  for (const NodeStatus& node : status.nodes()) {
    if (node.progress().accuracy_step() > 0 && !status.has_result()) {
      absl::StrAppend(
          &out, absl::StrFormat("last test %s %.4f at step %d (%s)\n", auc ? "AUC" : "accuracy",
                                auc ? node.progress().test_auc() : node.progress().test_accuracy(),
                                node.progress().accuracy_step(), node.name()));
    }
  }
  if (status.has_result() && status.result_without_score()) {
    absl::StrAppend(&out, "finished; the script reported no test accuracy\n");
  } else if (status.has_result() && auc) {
    absl::StrAppend(&out, absl::StrFormat("final test AUC %.4f, log loss %.4f\n",
                                          status.test_accuracy(), status.test_logloss()));
  } else if (status.has_result()) {
    absl::StrAppend(&out, absl::StrFormat("final test accuracy %.4f\n", status.test_accuracy()));
  }
  if (status.data_leases().example_count() > 0)
    absl::StrAppend(&out, FormatLeases(status.data_leases()));
  for (const NodeStatus& node : status.nodes()) {
    if (node.checkpoint_trouble().failed_writes() == 0) continue;
    const CheckpointTrouble& trouble = node.checkpoint_trouble();
    absl::StrAppend(&out, "checkpoints failing on ", node.name(), " since step ",
                    trouble.failing_since_step(), " (", trouble.failed_writes(),
                    trouble.failed_writes() == 1 ? " write" : " writes", "): ", trouble.error(),
                    "\n");
  }
  absl::StrAppend(&out, "\n", FormatNodes(status));
  return out;
}

}  // namespace paramserver
