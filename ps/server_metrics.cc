#include "ps/server_metrics.h"

#include <functional>
#include <string>

namespace paramserver {
namespace {

using Samples = std::vector<std::pair<MetricLabels, double>>;

MetricLabels ShardLabels(const ServerFigures::Shard& shard) {
  return {{"shard", std::to_string(shard.shard_id)},
          {"role", shard.primary ? "primary" : "backup"}};
}

// One sample per embedding shard held here: read(its counters).
Samples PerEmbeddingShard(const ServerFigures& figures,
                          const std::function<double(const EmbeddingCounters&)>& read) {
  Samples samples;
  for (const ServerFigures::Shard& shard : figures.shards) {
    if (shard.embedding.has_value())
      samples.push_back({ShardLabels(shard), read(*shard.embedding)});
  }
  return samples;
}

}  // namespace

std::vector<ScrapedFamily> ServerMetricFamilies(const ServerFigures& figures) {
  Samples applied, skipped, refused;
  for (const ServerFigures::Shard& shard : figures.shards) {
    applied.push_back({ShardLabels(shard), static_cast<double>(shard.applied_updates)});
    skipped.push_back({ShardLabels(shard), static_cast<double>(shard.skipped_steps)});
  }
  for (const auto& [reason, count] : figures.refusals)
    refused.push_back({{{"reason", GradientRefusalName(reason)}}, static_cast<double>(count)});
  std::vector<ScrapedFamily> families = {
      {"ps_shard_applied_updates_total",
       "Adam updates applied to each shard held here (rate(): updates/s).", true,
       std::move(applied)},
      {"ps_shard_skipped_steps_total",
       "Steps each shard held here skipped: sync, a worker's loss scaler found its gradient "
       "not finite (no update; counted in applied_updates too); async, such pushes.",
       true, std::move(skipped)},
      {"ps_embedding_rows", "Rows each embedding shard held here has made.", false,
       PerEmbeddingShard(figures,
                         [](const EmbeddingCounters& c) { return static_cast<double>(c.rows); })},
      {"ps_embedding_bytes",
       "Bytes each embedding shard's rows take (slabs, id map, recency links).", false,
       PerEmbeddingShard(figures, [](const EmbeddingCounters& c) { return c.bytes; })},
      {"ps_embedding_evicted_rows_total",
       "Rows evicted past model.max_rows (least recently updated first).", true,
       PerEmbeddingShard(
           figures,
           [](const EmbeddingCounters& c) { return static_cast<double>(c.evicted_rows); })},
      {"ps_embedding_dropped_gradients_total",
       "Row gradients dropped for ids short of model.min_count sightings.", true,
       PerEmbeddingShard(
           figures,
           [](const EmbeddingCounters& c) { return static_cast<double>(c.dropped_gradients); })},
      {"ps_refused_gradients_total",
       "Pushes refused for their gradient's values, by reason: nonfinite (a NaN or Inf), "
       "overflow (the optimizer's state could not hold it), norm (above "
       "training.max_gradient_norm).",
       true, std::move(refused)},
      {"ps_serving_map_version",
       "The shard map's version this server serves.",
       false,
       {{{}, static_cast<double>(figures.serving_epoch)}}},
  };
  if (figures.checkpoint_failed_writes.has_value()) {
    const auto [since_success, since_start] = *figures.checkpoint_failed_writes;
    families.push_back({"ps_checkpoint_failed_writes",
                        "Checkpoint writes that failed since the last one that succeeded (0: "
                        "checkpoints are written).",
                        false,
                        {{{}, static_cast<double>(since_success)}}});
    families.push_back({"ps_checkpoint_failed_writes_total",
                        "Checkpoint writes that failed since this server started.",
                        true,
                        {{{}, static_cast<double>(since_start)}}});
  }
  return families;
}

}  // namespace paramserver
