#include "tools/ctr_data.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>

#include "catch2/catch.hpp"
#include "common/testing/temp_dir.h"
#include "worker/criteo_dataset.h"
#include "worker/ctr_metrics.h"

namespace paramserver {
namespace {

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

CtrDataOptions Small(uint64_t seed) {
  CtrDataOptions options;
  options.seed = seed;
  options.train_examples = 4000;
  options.test_examples = 4000;
  options.vocabulary = 5000;
  options.missing_rate = 0.1;
  return options;
}

TEST_CASE("the same seed gives the same files; another seed, others") {
  TempDir dir;
  REQUIRE(WriteCtrData(Small(1), dir.File("a-train.tsv.gz"), dir.File("a-test.tsv.gz")).ok());
  REQUIRE(WriteCtrData(Small(1), dir.File("b-train.tsv.gz"), dir.File("b-test.tsv.gz")).ok());
  REQUIRE(WriteCtrData(Small(2), dir.File("c-train.tsv.gz"), dir.File("c-test.tsv.gz")).ok());
  CHECK(Slurp(dir.File("a-train.tsv.gz")) == Slurp(dir.File("b-train.tsv.gz")));
  CHECK(Slurp(dir.File("a-test.tsv.gz")) == Slurp(dir.File("b-test.tsv.gz")));
  CHECK(Slurp(dir.File("a-train.tsv.gz")) != Slurp(dir.File("c-train.tsv.gz")));
}

TEST_CASE("the files read back with the Criteo reader and have CTR data's shape") {
  TempDir dir;
  absl::StatusOr<CtrDataSummary> summary =
      WriteCtrData(Small(3), dir.File("train.tsv"), dir.File("test.tsv.gz"));
  REQUIRE(summary.ok());
  absl::StatusOr<CtrDataset> train = LoadCriteoFiles({dir.File("train.tsv")}, 13, 26);
  REQUIRE(train.ok());
  CHECK(train->example_count == 4000);
  // Missing values in both kinds of field, at about the asked rate (10%).
  const double missing_ids =
      std::count(train->ids.begin(), train->ids.end(), kMissingId) / double(train->ids.size());
  CHECK(missing_ids > 0.08);
  CHECK(missing_ids < 0.12);
  CHECK(std::count(train->dense.begin(), train->dense.end(), 0.0f) > 0);
  // Zipf: field C1's most frequent id is far more frequent than its median one, and ids
  // spread over the 32-bit space.
  std::map<int64_t, int> counts;
  int64_t largest_id = 0;
  for (int64_t i = 0; i < train->example_count; ++i) {
    const int64_t id = train->ids[i * 26];
    if (id == kMissingId) continue;
    ++counts[id];
    largest_id = std::max(largest_id, id);
  }
  std::vector<int> frequencies;
  for (const auto& [id, count] : counts) frequencies.push_back(count);
  std::sort(frequencies.rbegin(), frequencies.rend());
  CHECK(frequencies.front() > 20 * frequencies[frequencies.size() / 2]);
  CHECK(largest_id > (int64_t{1} << 31));
  // The planted model is learnable but not trivially: the best AUC is well above chance.
  CHECK(summary->best_test_auc > 0.7);
  CHECK(summary->best_test_auc < 0.99);
  CHECK(summary->test_positive_rate > 0.1);
  CHECK(summary->test_positive_rate < 0.6);
}

TEST_CASE("options out of range are refused") {
  TempDir dir;
  CtrDataOptions options = Small(1);
  options.missing_rate = 1;
  CHECK(WriteCtrData(options, dir.File("x"), dir.File("y")).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(WriteCtrData(Small(1), dir.File("no/such/dir/x"), dir.File("y")).status().code() ==
        absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace paramserver
