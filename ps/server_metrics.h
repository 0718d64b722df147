// A parameter server's gauges and counters on /metrics, all computed from one look at
// the shards it holds (ServerFigures): a scrape reads each shard's counters once.
#ifndef PARAMSERVER_PS_SERVER_METRICS_H_
#define PARAMSERVER_PS_SERVER_METRICS_H_

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "common/ops/metrics.h"
#include "ps/embedding_storage.h"
#include "ps/gradient_refusals.h"

namespace paramserver {

// What a scrape shows, read from the server at once.
struct ServerFigures {
  struct Shard {
    int shard_id = 0;
    bool primary = false;
    int64_t applied_updates = 0;
    int64_t skipped_steps = 0;                   // ShardCounters'
    std::optional<EmbeddingCounters> embedding;  // an embedding shard's
  };
  std::vector<Shard> shards;
  std::vector<std::pair<GradientRefusal, int64_t>> refusals;  // by reason
  int64_t serving_epoch = 0;
  // With checkpoint.dir: writes failing since the last success, and since the start.
  std::optional<std::pair<int64_t, int64_t>> checkpoint_failed_writes;
};

// ps_shard_applied_updates_total, ps_embedding_rows, ps_embedding_bytes,
// ps_embedding_evicted_rows_total, ps_embedding_dropped_gradients_total,
// ps_refused_gradients_total, ps_serving_map_version, and with checkpoints
// ps_checkpoint_failed_writes and ps_checkpoint_failed_writes_total.
std::vector<ScrapedFamily> ServerMetricFamilies(const ServerFigures& figures);

}  // namespace paramserver

#endif  // PARAMSERVER_PS_SERVER_METRICS_H_
