// The CTR step on a GPU against the CPU's: the logits, the loss, every MLP gradient and
// every row gradient, for several shapes (a missing id, a row shared by many examples,
// batch 1, a field with no id at all); and with one layer, where the segmented sums are
// the only sums, the row gradients within 1e-6. Each test case that needs a GPU prints
// "SKIPPED: <reason>" and checks nothing where none is usable; tests/run.sh counts those
// as skipped. The rows' segments are host code, checked wherever the toolkit builds this
// test, GPU or not, and so is the refusal of tables of several dims.
#include "worker/cuda/ctr_cuda_compute.h"

#include <cmath>
#include <random>

#include "catch2/catch.hpp"
#include "worker/cuda/gpu_devices.h"
#include "worker/cuda/skip_without_gpu.h"

namespace paramserver {
namespace cuda {
namespace {

struct Problem {
  CtrModelShape shape;
  std::vector<float> mlp, dense, labels;
  std::vector<int64_t> ids;
  BatchRows rows;
  std::vector<std::vector<float>> pulled;
  CtrBatchView batch() const {
    return {static_cast<int64_t>(labels.size()), dense.data(), ids.data(), labels.data()};
  }
};

Problem MakeProblem(int dense, int fields, int dim, std::vector<int64_t> hidden, int examples,
                    int vocabulary, uint64_t seed) {
  Problem p;
  p.shape.dense_features = dense;
  p.shape.categorical_features = fields;
  p.shape.embedding_dim = dim;
  p.shape.layers = {dense + fields * dim};
  p.shape.layers.insert(p.shape.layers.end(), hidden.begin(), hidden.end());
  p.shape.layers.push_back(1);
  std::mt19937_64 random(seed);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  const MlpLayout layout(p.shape.layers);
  p.mlp.resize(layout.total_parameters());
  for (float& w : p.mlp) w = normal(random);
  for (int i = 0; i < examples * dense; ++i) p.dense.push_back(normal(random));
  for (int b = 0; b < examples; ++b) {
    p.labels.push_back(static_cast<float>(random() % 2));
    for (int k = 0; k < fields; ++k) {
      // Field 1 is always missing; others miss one time in 8.
      const bool missing = k == 1 || random() % 8 == 0;
      p.ids.push_back(missing ? -1 : static_cast<int64_t>(random() % vocabulary) * 7919);
    }
  }
  p.rows = DeduplicateIds(p.shape, p.batch());
  for (int k = 0; k < fields; ++k) {
    std::vector<float>& rows = p.pulled.emplace_back();
    for (size_t i = 0; i < p.rows.unique_ids[k].size() * dim; ++i) rows.push_back(normal(random));
  }
  return p;
}

// The largest |a - b| relative to the largest |b| (at least 1).
double RelativeError(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double worst = 0, scale = 1;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, static_cast<double>(std::fabs(a[i] - b[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(b[i])));
  }
  return worst / scale;
}

TEST_CASE("a batch's rows become one segment per unique row, its examples ascending") {
  // Host code only: runs on a machine without a GPU (the toolkit builds it). 3 examples, 2 fields,
  // dim 2, 1 dense feature.
  CtrModelShape shape;
  shape.dense_features = 1;
  shape.categorical_features = 2;
  shape.embedding_dim = 2;
  BatchRows rows;
  rows.unique_ids = {{10, 20}, {7}};
  // Example 0: rows 20, 7; example 1: 10, missing; example 2: 20, 7.
  rows.row_of = {1, 0, 0, -1, 1, 0};
  const std::vector<std::vector<float>> pulled = {{1, 2, 3, 4}, {5, 6}};
  const RowSegments segments = RowSegments::Of(shape, 3, rows, pulled);
  CHECK(segments.unique == 3);
  CHECK(segments.row_base == std::vector<int32_t>{0, 2});
  CHECK(segments.all_rows == std::vector<float>{1, 2, 3, 4, 5, 6});
  // Row 10 (index 0): example 1; row 20: examples 0 and 2; row 7: examples 0 and 2.
  CHECK(segments.segment_begin == std::vector<int32_t>{0, 1, 3, 5});
  CHECK(segments.segment_examples == std::vector<int32_t>{1, 0, 2, 0, 2});
  // Field 0's rows feed columns from 1 (after the dense feature), field 1's from 3.
  CHECK(segments.column == std::vector<int32_t>{1, 1, 3});
}

TEST_CASE("the GPU's CTR step equals the CPU's: logits, loss, MLP and row gradients") {
  if (SkipWithoutGpu()) return;
  struct Shape {
    int dense, fields, dim;
    std::vector<int64_t> hidden;
    int examples, vocabulary;
  };
  for (const Shape& s : std::vector<Shape>{{13, 26, 16, {256, 128}, 256, 50},
                                           {3, 4, 4, {8}, 1, 5},
                                           {0, 3, 7, {}, 33, 3},
                                           {5, 2, 1, {9, 4}, 1000, 1000}}) {
    Problem p = MakeProblem(s.dense, s.fields, s.dim, s.hidden, s.examples, s.vocabulary, 5);
    absl::StatusOr<std::unique_ptr<CtrCudaCompute>> gpu = CtrCudaCompute::Create(p.shape, 0);
    REQUIRE(gpu.ok());
    const CtrStepResult cpu = CtrForwardBackward(p.shape, p.mlp, p.batch(), p.rows, p.pulled, true);
    absl::StatusOr<CtrStepResult> ours = (*gpu)->Step(p.mlp, p.batch(), p.rows, p.pulled, true);
    REQUIRE(ours.ok());
    INFO("shape " << s.dense << "+" << s.fields << "x" << s.dim << ", " << s.examples
                  << " examples");
    // FP32 sums of up to a few hundred terms in cuBLAS's order instead of the CPU's.
    CHECK(RelativeError(ours->logits, cpu.logits) < 1e-5);
    CHECK(std::fabs(ours->loss - cpu.loss) < 1e-5 * std::max(1.0, cpu.loss));
    CHECK(RelativeError(ours->dense_gradient, cpu.dense_gradient) < 1e-5);
    REQUIRE(ours->row_gradients.size() == cpu.row_gradients.size());
    for (size_t k = 0; k < cpu.row_gradients.size(); ++k)
      CHECK(RelativeError(ours->row_gradients[k], cpu.row_gradients[k]) < 1e-5);
    absl::StatusOr<CtrStepResult> scored = (*gpu)->Step(p.mlp, p.batch(), p.rows, p.pulled, false);
    REQUIRE(scored.ok());
    CHECK(scored->logits == ours->logits);
    CHECK(scored->dense_gradient.empty());
  }
}

TEST_CASE("with one layer, the segmented sums alone: row gradients within 1e-6") {
  if (SkipWithoutGpu()) return;
  // One layer: d loss / d x = delta * W, one product per element on both sides, so the
  // only sums are the segmented ones, in ascending example order on both.
  Problem p = MakeProblem(2, 3, 4, {}, 500, 7, 9);
  absl::StatusOr<std::unique_ptr<CtrCudaCompute>> gpu = CtrCudaCompute::Create(p.shape, 0);
  REQUIRE(gpu.ok());
  const CtrStepResult cpu = CtrForwardBackward(p.shape, p.mlp, p.batch(), p.rows, p.pulled, true);
  absl::StatusOr<CtrStepResult> ours = (*gpu)->Step(p.mlp, p.batch(), p.rows, p.pulled, true);
  REQUIRE(ours.ok());
  // The logits themselves may differ in the last place (cuBLAS's dot product order), so
  // compare the sums on the GPU's own deltas: equal within an ulp per term.
  for (size_t k = 0; k < cpu.row_gradients.size(); ++k)
    CHECK(RelativeError(ours->row_gradients[k], cpu.row_gradients[k]) < 1e-6);
}

TEST_CASE("tables of several dims are refused before any GPU is touched, naming why") {
  // No GPU needed: the kernels gather rows of one width, and Create says so first
  // (device auto then computes on the CPU, whose step takes any dims).
  Problem p = MakeProblem(2, 3, 4, {}, 10, 7, 9);
  p.shape.table_dims = {4, 2, 4};
  p.shape.layers.front() = 2 + 4 + 2 + 4;
  absl::StatusOr<std::unique_ptr<CtrCudaCompute>> gpu = CtrCudaCompute::Create(p.shape, 0);
  CHECK(gpu.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(std::string(gpu.status().message()).find("needs one dim for every table") !=
        std::string::npos);
  p.shape.table_dims = {4, 4, 4};  // given per table, all the same: the GPU's step takes it
  p.shape.layers.front() = 2 + 3 * 4;
  CHECK(p.shape.uniform_dims());
}

}  // namespace
}  // namespace cuda
}  // namespace paramserver
