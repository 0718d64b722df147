#include "worker/worker_metrics.h"

#include <map>
#include <string>

#include "catch2/catch.hpp"

namespace paramserver {
namespace {

// name -> its samples' values, in order.
std::map<std::string, std::vector<double>> ByName(const std::vector<ScrapedFamily>& families) {
  std::map<std::string, std::vector<double>> values;
  for (const ScrapedFamily& family : families) {
    CHECK(!family.counter);
    CHECK(!family.help.empty());
    std::vector<double>& samples = values[family.name];
    for (const auto& [labels, value] : family.samples) {
      CHECK(labels.empty());
      samples.push_back(value);
    }
  }
  return values;
}

NodeProgress Progress() {
  NodeProgress progress;
  progress.set_step(120);
  progress.set_total_steps(937);
  progress.set_epoch(1);
  progress.set_loss(0.25);
  progress.set_samples_per_sec(4000);
  return progress;
}

TEST_CASE("a worker's gauges come from its progress, one sample each") {
  const auto values = ByName(WorkerMetricFamilies(Progress(), EvaluationFigure::kAccuracy));
  CHECK(values.at("worker_step") == std::vector<double>{120});
  CHECK(values.at("worker_total_steps") == std::vector<double>{937});
  CHECK(values.at("worker_epoch") == std::vector<double>{1});
  CHECK(values.at("worker_loss") == std::vector<double>{0.25});
  CHECK(values.at("worker_samples_per_second") == std::vector<double>{4000});
  // Not evaluated yet: the figures have no sample.
  CHECK(values.at("worker_test_accuracy").empty());
  CHECK(values.at("worker_test_auc").empty());
}

TEST_CASE("after an evaluation only the job's own figure has a sample") {
  NodeProgress progress = Progress();
  progress.set_accuracy_step(937);
  progress.set_test_accuracy(0.875);
  progress.set_test_auc(0.75);
  const auto mlp = ByName(WorkerMetricFamilies(progress, EvaluationFigure::kAccuracy));
  CHECK(mlp.at("worker_test_accuracy") == std::vector<double>{0.875});
  CHECK(mlp.at("worker_test_auc").empty());
  const auto ctr = ByName(WorkerMetricFamilies(progress, EvaluationFigure::kAuc));
  CHECK(ctr.at("worker_test_accuracy").empty());
  CHECK(ctr.at("worker_test_auc") == std::vector<double>{0.75});
  const auto script = ByName(WorkerMetricFamilies(progress, EvaluationFigure::kNone));
  CHECK(script.at("worker_test_accuracy").empty());
  CHECK(script.at("worker_test_auc").empty());
}

}  // namespace
}  // namespace paramserver
