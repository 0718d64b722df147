#include "common/model/embedding_init.h"

#include "catch2/catch.hpp"

namespace paramserver {
namespace {

NamedTensor Ids(const std::string& name, std::vector<int64_t> ids) {
  return {name, {static_cast<int64_t>(ids.size())}, {}, TensorDtype::kI64, ids};
}

std::string ErrorOf(const std::vector<NamedTensor>& tensors) {
  absl::StatusOr<std::vector<TableRows>> rows = EmbeddingRowsFromTensors(tensors, {2, 2}, "init");
  REQUIRE_FALSE(rows.ok());
  CHECK(rows.status().code() == absl::StatusCode::kInvalidArgument);
  return std::string(rows.status().message());
}

TEST_CASE("init_from's table tensors give rows sorted by id; the rest are left alone") {
  const std::vector<NamedTensor> tensors = {
      {"fc1.weight", {1}, {0.5f}},
      Ids("C2.ids", {9, 4}),
      {"C2.weight", {2, 2}, {9, 9.5f, 4, 4.5f}},
  };
  absl::StatusOr<std::vector<TableRows>> rows = EmbeddingRowsFromTensors(tensors, {2, 2}, "init");
  REQUIRE(rows.ok());
  CHECK(rows->at(0).ids.empty());
  CHECK(rows->at(1).ids == std::vector<int64_t>{4, 9});
  CHECK(rows->at(1).rows == std::vector<float>{4, 4.5f, 9, 9.5f});
  const std::vector<NamedTensor> written = TensorsOfTables(*rows, {2, 2});
  REQUIRE(written.size() == 4);
  CHECK(written[2].name == "C2.ids");
  CHECK(written[2].int_values == std::vector<int64_t>{4, 9});
  CHECK(written[3].shape == std::vector<int64_t>{2, 2});
}

TEST_CASE("bad table tensors in init_from are errors naming the tensor") {
  CHECK(ErrorOf({Ids("C3.ids", {1}), {"C3.weight", {1, 2}, {1, 2}}}) ==
        "init: tensor 'C3.ids' is for table C3, which the model lacks (its tables are C1..C2)");
  CHECK(ErrorOf({Ids("C1.ids", {1})}) == "init: C1.weight is missing; a table's rows need both");
  CHECK(ErrorOf({{"C1.ids", {1}, {1.0f}}, {"C1.weight", {1, 2}, {1, 2}}}) ==
        "init: C1.ids must be I64 of shape [n], it is F32 [1]");
  CHECK(ErrorOf({Ids("C1.ids", {1, 2}), {"C1.weight", {1, 2}, {1, 2}}}) ==
        "init: C1.weight must be F32 [2, 2] for its 2 ids, it is F32 [1, 2]");
  CHECK(ErrorOf({Ids("C1.ids", {5, 5}), {"C1.weight", {2, 2}, {1, 2, 3, 4}}}) ==
        "init: C1.ids holds id 5 twice");
}

}  // namespace
}  // namespace paramserver
