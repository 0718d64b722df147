// A server's metric families from figures made by hand.
#include "ps/server_metrics.h"

#include <map>

#include "catch2/catch.hpp"

namespace paramserver {
namespace {

using Samples = std::vector<std::pair<MetricLabels, double>>;

std::map<std::string, ScrapedFamily> ByName(const ServerFigures& figures) {
  std::map<std::string, ScrapedFamily> families;
  for (ScrapedFamily& family : ServerMetricFamilies(figures))
    families[family.name] = std::move(family);
  return families;
}

ServerFigures TwoShards() {
  ServerFigures figures;
  figures.shards.push_back({3, true, 120, 2, std::nullopt});
  EmbeddingCounters rows;
  rows.rows = 50;
  rows.bytes = 4096.5;
  rows.evicted_rows = 7;
  rows.dropped_gradients = 2;
  figures.shards.push_back({4, false, 118, 0, rows});
  figures.refusals = {{GradientRefusal::kNonFinite, 1}, {GradientRefusal::kNorm, 5}};
  figures.serving_epoch = 9;
  return figures;
}

TEST_CASE("a server's families: each shard's updates, the embedding shards' rows, refusals") {
  std::map<std::string, ScrapedFamily> families = ByName(TwoShards());
  CHECK(families.size() == 8);  // no checkpoint.dir: no checkpoint families
  const ScrapedFamily& applied = families["ps_shard_applied_updates_total"];
  CHECK(applied.counter);
  CHECK(applied.samples == Samples{{{{"shard", "3"}, {"role", "primary"}}, 120.0},
                                   {{{"shard", "4"}, {"role", "backup"}}, 118.0}});
  const ScrapedFamily& skipped = families["ps_shard_skipped_steps_total"];
  CHECK(skipped.counter);
  CHECK(skipped.samples == Samples{{{{"shard", "3"}, {"role", "primary"}}, 2.0},
                                   {{{"shard", "4"}, {"role", "backup"}}, 0.0}});
  // Only the embedding shard has rows.
  CHECK(families["ps_embedding_rows"].samples ==
        Samples{{{{"shard", "4"}, {"role", "backup"}}, 50.0}});
  CHECK(families["ps_embedding_bytes"].samples.at(0).second == 4096.5);
  CHECK(families["ps_embedding_evicted_rows_total"].counter);
  CHECK(families["ps_embedding_evicted_rows_total"].samples.at(0).second == 7);
  CHECK(families["ps_embedding_dropped_gradients_total"].samples.at(0).second == 2);
  CHECK(families["ps_refused_gradients_total"].samples ==
        Samples{{{{"reason", "nonfinite"}}, 1.0}, {{{"reason", "norm"}}, 5.0}});
  CHECK(families["ps_serving_map_version"].samples == Samples{{{}, 9.0}});
  CHECK_FALSE(families["ps_serving_map_version"].counter);
}

TEST_CASE("with checkpoints, a server also shows its failing writes") {
  ServerFigures figures = TwoShards();
  figures.checkpoint_failed_writes.emplace(2, 11);
  std::map<std::string, ScrapedFamily> families = ByName(figures);
  CHECK(families["ps_checkpoint_failed_writes"].samples == Samples{{{}, 2.0}});
  CHECK(families["ps_checkpoint_failed_writes_total"].samples == Samples{{{}, 11.0}});
  CHECK(families["ps_checkpoint_failed_writes_total"].counter);
}

}  // namespace
}  // namespace paramserver
