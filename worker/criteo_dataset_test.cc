#include "worker/criteo_dataset.h"

#include <zlib.h>

#include <cmath>
#include <string>

#include "catch2/catch.hpp"
#include "common/testing/temp_dir.h"

namespace paramserver {
namespace {

CtrDataset Empty(int dense, int categorical) {
  CtrDataset dataset;
  dataset.dense_features = dense;
  dataset.categorical_features = categorical;
  return dataset;
}

TEST_CASE("a line's fields become the label, log(1 + max(x, 0)) and unsigned ids") {
  CtrDataset dataset = Empty(3, 2);
  REQUIRE(ParseCriteoLine("1\t5\t\t-3\t68fd1e64\t", &dataset).ok());
  REQUIRE(ParseCriteoLine("0\t0\t12\t7\tFFFFFFFF\t0a\r", &dataset).ok());  // CRLF, short hex
  CHECK(dataset.example_count == 2);
  CHECK(dataset.labels == std::vector<float>{1, 0});
  CHECK(dataset.dense[0] == static_cast<float>(std::log1p(5.0)));
  CHECK(dataset.dense[1] == 0);  // missing
  CHECK(dataset.dense[2] == 0);  // negative: max(x, 0)
  CHECK(dataset.dense[4] == static_cast<float>(std::log1p(12.0)));
  CHECK(dataset.ids == std::vector<int64_t>{0x68fd1e64, kMissingId, 0xffffffffLL, 0x0a});
}

TEST_CASE("a malformed line is refused naming the field, and leaves the dataset as it was") {
  CtrDataset dataset = Empty(2, 2);
  const auto error = [&](const std::string& line) {
    const absl::Status status = ParseCriteoLine(line, &dataset);
    CHECK(status.code() == absl::StatusCode::kInvalidArgument);
    return std::string(status.message());
  };
  CHECK(error("1\t2\t3\tab") ==
        "line: 4 tab-separated fields, expected 5 (label, 2 dense, 2 categorical)");
  CHECK(error("2\t1\t1\tab\tcd") == "label: '2' is not 0 or 1");
  CHECK(error("1\t1.5\t1\tab\tcd") == "I1: '1.5' is not an integer");
  CHECK(error("1\t1\t1\tab\txyz") == "C2: 'xyz' is not 1 to 8 hex digits");
  CHECK(error("1\t1\t1\t123456789\tcd") == "C1: '123456789' is not 1 to 8 hex digits");
  CHECK(error("1\t1\t1\t-1\tcd") == "C1: '-1' is not 1 to 8 hex digits");
  CHECK(dataset.example_count == 0);
  CHECK(dataset.labels.empty());
  CHECK(dataset.ids.empty());
}

TEST_CASE("files are read gzip'd or plain, in order; errors name the file and the line") {
  TempDir dir;
  const std::string plain = dir.WriteFile("a.tsv", "1\t3\tab\n0\t\t\n");
  const std::string gz = dir.File("b.tsv.gz");
  gzFile out = gzopen(gz.c_str(), "wb");
  const std::string text = "0\t7\tff\n1\t1\t10";  // the last line without a newline
  gzwrite(out, text.data(), text.size());
  gzclose(out);
  absl::StatusOr<CtrDataset> both = LoadCriteoFiles({plain, gz}, 1, 1);
  REQUIRE(both.ok());
  CHECK(both->example_count == 4);
  CHECK(both->labels == std::vector<float>{1, 0, 0, 1});
  CHECK(both->ids == std::vector<int64_t>{0xab, kMissingId, 0xff, 0x10});

  const std::string bad = dir.WriteFile("bad.tsv", "1\t3\tab\n1\t3\tzz\n");
  CHECK(LoadCriteoFiles({plain, bad}, 1, 1).status().message() ==
        bad + ":2: C1: 'zz' is not 1 to 8 hex digits");
  CHECK(LoadCriteoFiles({dir.File("absent.tsv")}, 1, 1).status().code() ==
        absl::StatusCode::kNotFound);
  CHECK(LoadCriteoFiles({dir.WriteFile("empty.tsv", "")}, 1, 1).status().message() ==
        dir.File("empty.tsv") + ": no examples");
  // A gzip stream cut short.
  const std::string whole = dir.File("whole.tsv.gz");
  out = gzopen(whole.c_str(), "wb");
  std::string many;
  for (int i = 0; i < 5000; ++i) many += "1\t" + std::to_string(i) + "\tab\n";
  gzwrite(out, many.data(), many.size());
  gzclose(out);
  FILE* in = std::fopen(whole.c_str(), "rb");
  std::string bytes(1 << 20, '\0');
  bytes.resize(std::fread(bytes.data(), 1, bytes.size(), in));
  std::fclose(in);
  const std::string cut = dir.WriteFile("cut.tsv.gz", bytes.substr(0, bytes.size() / 2));
  absl::StatusOr<CtrDataset> truncated = LoadCriteoFiles({cut}, 1, 1);
  CHECK_FALSE(truncated.ok());
  CHECK(std::string(truncated.status().message()).find(cut) == 0);
}

}  // namespace
}  // namespace paramserver
