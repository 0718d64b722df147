#include "worker/ctr_model.h"

#include <cmath>
#include <cstdint>
#include <random>
#include <set>
#include <vector>

#include "catch2/catch.hpp"

namespace paramserver {
namespace {

// A tiny model: 2 dense features, 2 fields of width-3 rows, MLP 8 -> 5 -> 1.
CtrModelShape Shape() {
  CtrModelShape shape;
  shape.dense_features = 2;
  shape.categorical_features = 2;
  shape.embedding_dim = 3;
  shape.layers = {8, 5, 1};
  return shape;
}

// The same with tables of their own dims: field 0's rows 3 wide, field 1's 1 wide.
CtrModelShape ShapeWithTableDims() {
  CtrModelShape shape = Shape();
  shape.table_dims = {3, 1};
  shape.layers = {6, 5, 1};
  return shape;
}

struct Fixture {
  CtrModelShape shape;
  std::vector<float> dense = {0.5f, 1.0f, 0.0f, 2.0f, 1.5f, 0.25f, 0.75f, 0.0f};
  // Example 0 and 2 share field 0's id 900; example 3's field 1 is missing.
  std::vector<int64_t> ids = {900, 7, 12, 7, 900, 5, 12, -1};
  std::vector<float> labels = {1, 0, 0, 1};
  std::vector<float> mlp;
  std::vector<std::vector<float>> rows;
  BatchRows batch_rows;
  CtrBatchView View() const { return {4, dense.data(), ids.data(), labels.data()}; }
  explicit Fixture(CtrModelShape model_shape = Shape()) : shape(std::move(model_shape)) {
    std::mt19937 random(3);
    std::uniform_real_distribution<float> uniform(-0.6f, 0.6f);
    mlp.resize(MlpLayout(shape.layers).total_parameters());
    for (float& p : mlp) p = uniform(random);
    batch_rows = DeduplicateIds(shape, View());
    for (int k = 0; k < 2; ++k) {
      rows.emplace_back(batch_rows.unique_ids[k].size() * shape.dim(k));
      for (float& v : rows.back()) v = uniform(random);
    }
  }
};

// The loss, computed independently in double (no ReLU masks, no dedup: each example
// looks its row up by id).
double ReferenceLoss(const Fixture& f, const std::vector<double>& mlp,
                     const std::vector<std::vector<double>>& rows) {
  const MlpLayout layout(f.shape.layers);
  double loss = 0;
  for (int b = 0; b < 4; ++b) {
    std::vector<double> h = {f.dense[2 * b], f.dense[2 * b + 1]};
    for (int k = 0; k < 2; ++k) {
      const int64_t id = f.ids[2 * b + k];
      const std::vector<int64_t>& unique = f.batch_rows.unique_ids[k];
      const int dim = f.shape.dim(k);
      for (int e = 0; e < dim; ++e) {
        double value = 0;
        for (size_t u = 0; u < unique.size(); ++u) {
          if (unique[u] == id) value = rows[k][u * dim + e];
        }
        h.push_back(value);
      }
    }
    for (int l = 0; l < layout.num_layers(); ++l) {
      std::vector<double> next;
      const int64_t in = f.shape.layers[l], out = f.shape.layers[l + 1];
      for (int64_t o = 0; o < out; ++o) {
        double z = mlp[layout.bias(l).offset + o];
        for (int64_t i = 0; i < in; ++i) z += mlp[layout.weight(l).offset + o * in + i] * h[i];
        next.push_back(l + 1 < layout.num_layers() ? std::max(z, 0.0) : z);
      }
      h = next;
    }
    const double p = 1 / (1 + std::exp(-h[0]));
    loss += -(f.labels[b] * std::log(p) + (1 - f.labels[b]) * std::log(1 - p));
  }
  return loss / 4;
}

TEST_CASE("each field's ids are deduplicated, ascending; a missing id has no row") {
  Fixture f;
  CHECK(f.batch_rows.unique_ids[0] == std::vector<int64_t>{12, 900});
  CHECK(f.batch_rows.unique_ids[1] == std::vector<int64_t>{5, 7});
  CHECK(f.batch_rows.row_of == std::vector<int32_t>{1, 1, 0, 1, 1, 0, 0, -1});
}

TEST_CASE("deduplication agrees with a sorted set on random batches") {
  std::mt19937_64 random(5);
  for (int fields : {1, 3, 26}) {
    for (int64_t size : {0, 1, 2, 17, 256, 1000}) {
      CtrModelShape shape;
      shape.categorical_features = fields;
      // Ids from a small range (many repeats), a wide one (few), int64's ends, and missing.
      std::vector<int64_t> ids(size * fields);
      for (int64_t& id : ids) {
        switch (random() % 5) {
          case 0:
            id = -1;
            break;
          case 1:
            id = static_cast<int64_t>(random() % 7);
            break;
          case 2:
            id = static_cast<int64_t>(random() >> 1);
            break;
          case 3:
            id = (random() % 2) ? INT64_MAX : 0;
            break;
          default:
            id = static_cast<int64_t>(random() % 100);
            break;
        }
      }
      CtrBatchView batch;
      batch.size = size;
      batch.ids = ids.data();
      const BatchRows rows = DeduplicateIds(shape, batch);
      INFO("fields " << fields << " batch " << size);
      REQUIRE(static_cast<int>(rows.unique_ids.size()) == fields);
      REQUIRE(static_cast<int64_t>(rows.row_of.size()) == size * fields);
      for (int k = 0; k < fields; ++k) {
        std::set<int64_t> distinct;
        for (int64_t b = 0; b < size; ++b) {
          if (ids[b * fields + k] >= 0) distinct.insert(ids[b * fields + k]);
        }
        CHECK(rows.unique_ids[k] == std::vector<int64_t>(distinct.begin(), distinct.end()));
        for (int64_t b = 0; b < size; ++b) {
          const int64_t id = ids[b * fields + k];
          const int32_t at = rows.row_of[b * fields + k];
          if (id < 0) {
            CHECK(at == -1);
          } else {
            REQUIRE(at >= 0);
            REQUIRE(at < static_cast<int32_t>(rows.unique_ids[k].size()));
            CHECK(rows.unique_ids[k][at] == id);
          }
        }
      }
    }
  }
}

void CheckAgainstFiniteDifferences(const Fixture& f) {
  const CtrStepResult step =
      CtrForwardBackward(f.shape, f.mlp, f.View(), f.batch_rows, f.rows, /*backward=*/true);
  std::vector<double> mlp(f.mlp.begin(), f.mlp.end());
  std::vector<std::vector<double>> rows;
  for (const auto& r : f.rows) rows.emplace_back(r.begin(), r.end());
  CHECK(std::abs(step.loss - ReferenceLoss(f, mlp, rows)) < 1e-6);
  // Central differences in double: error O(h^2) plus rounding, far below float's.
  const double h = 1e-5;
  // Float gradients carry float rounding: relative 1e-4 plus an absolute 1e-6.
  const auto close = [](double analytic, double numeric) {
    return std::abs(analytic - numeric) <= 1e-4 * std::abs(numeric) + 1e-6;
  };
  for (size_t i = 0; i < mlp.size(); ++i) {
    const double keep = mlp[i];
    mlp[i] = keep + h;
    const double up = ReferenceLoss(f, mlp, rows);
    mlp[i] = keep - h;
    const double down = ReferenceLoss(f, mlp, rows);
    mlp[i] = keep;
    INFO("dense parameter " << i);
    CHECK(close(step.dense_gradient[i], (up - down) / (2 * h)));
  }
  for (int k = 0; k < 2; ++k) {
    for (size_t i = 0; i < rows[k].size(); ++i) {
      const double keep = rows[k][i];
      rows[k][i] = keep + h;
      const double up = ReferenceLoss(f, mlp, rows);
      rows[k][i] = keep - h;
      const double down = ReferenceLoss(f, mlp, rows);
      rows[k][i] = keep;
      INFO("field " << k << " element " << i);
      CHECK(close(step.row_gradients[k][i], (up - down) / (2 * h)));
    }
  }
  // The shared row (id 900, two examples) gets both contributions; a gradient exists.
  CHECK(step.row_gradients[0][3] != 0);
}

TEST_CASE("the loss and every gradient agree with finite differences of an independent model") {
  CheckAgainstFiniteDifferences(Fixture());
}

TEST_CASE("tables of their own dims: each field's rows at its column, gradients as before") {
  const Fixture f(ShapeWithTableDims());
  REQUIRE(ValidateCtrModelShape(f.shape).ok());
  CHECK(f.shape.column(1) == 5);
  CHECK(f.shape.input_width() == 6);
  CHECK_FALSE(f.shape.uniform_dims());
  CheckAgainstFiniteDifferences(f);
  const CtrStepResult step =
      CtrForwardBackward(f.shape, f.mlp, f.View(), f.batch_rows, f.rows, /*backward=*/true);
  CHECK(step.row_gradients[1].size() == 2);  // two ids of field 1, one float each
  CtrModelShape wrong = f.shape;
  wrong.table_dims = {3};
  CHECK(std::string(ValidateCtrModelShape(wrong).message()) ==
        "ctr model: one table dim >= 1 per field (2), got 1");
}

TEST_CASE("evaluation fills the loss and the logits only; shapes are checked") {
  Fixture f;
  const CtrStepResult forward =
      CtrForwardBackward(f.shape, f.mlp, f.View(), f.batch_rows, f.rows, /*backward=*/false);
  CHECK(forward.logits.size() == 4);
  CHECK(forward.dense_gradient.empty());
  CHECK(ValidateCtrModelShape(f.shape).ok());
  CtrModelShape wrong = f.shape;
  wrong.layers = {9, 5, 1};
  CHECK(std::string(ValidateCtrModelShape(wrong).message()) ==
        "ctr model: layers[0] must be dense_features + the tables' dims = 8");
  wrong.layers = {8, 5, 2};
  CHECK(std::string(ValidateCtrModelShape(wrong).message()) ==
        "ctr model: the last layer must be 1 (one logit)");
}

}  // namespace
}  // namespace paramserver
