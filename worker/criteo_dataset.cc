#include "worker/criteo_dataset.h"

#include <zlib.h>

#include <cmath>
#include <cstring>
#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace paramserver {
namespace {

absl::Status FieldError(absl::string_view field, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

// The first 40 characters of a value, for an error message.
std::string Shown(absl::string_view value) {
  return value.size() <= 40 ? std::string(value) : absl::StrCat(value.substr(0, 40), "...");
}

}  // namespace

absl::Status ParseCriteoLine(absl::string_view line, CtrDataset* dataset) {
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  const std::vector<absl::string_view> fields = absl::StrSplit(line, '\t');
  const size_t expected = 1 + dataset->dense_features + dataset->categorical_features;
  if (fields.size() != expected) {
    return FieldError("line",
                      absl::StrCat(fields.size(), " tab-separated fields, expected ", expected,
                                   " (label, ", dataset->dense_features, " dense, ",
                                   dataset->categorical_features, " categorical)"));
  }
  float label;
  if (fields[0] == "0") {
    label = 0;
  } else if (fields[0] == "1") {
    label = 1;
  } else {
    return FieldError("label", absl::StrCat("'", Shown(fields[0]), "' is not 0 or 1"));
  }
  std::vector<float> dense(dataset->dense_features);
  for (int j = 0; j < dataset->dense_features; ++j) {
    const absl::string_view value = fields[1 + j];
    if (value.empty()) continue;  // missing: 0
    int64_t x;
    if (!absl::SimpleAtoi(value, &x)) {
      return FieldError(absl::StrCat("I", j + 1),
                        absl::StrCat("'", Shown(value), "' is not an integer"));
    }
    dense[j] = static_cast<float>(std::log1p(static_cast<double>(std::max<int64_t>(x, 0))));
  }
  std::vector<int64_t> ids(dataset->categorical_features, kMissingId);
  for (int k = 0; k < dataset->categorical_features; ++k) {
    const absl::string_view value = fields[1 + dataset->dense_features + k];
    if (value.empty()) continue;  // missing: an empty bag
    uint32_t id;
    if (value.size() > 8 ||
        !std::all_of(value.begin(), value.end(), [](char c) { return absl::ascii_isxdigit(c); }) ||
        !absl::SimpleHexAtoi(value, &id)) {
      return FieldError(absl::StrCat("C", k + 1),
                        absl::StrCat("'", Shown(value), "' is not 1 to 8 hex digits"));
    }
    ids[k] = id;
  }
  dataset->labels.push_back(label);
  dataset->dense.insert(dataset->dense.end(), dense.begin(), dense.end());
  dataset->ids.insert(dataset->ids.end(), ids.begin(), ids.end());
  ++dataset->example_count;
  return absl::OkStatus();
}

absl::StatusOr<CtrDataset> LoadCriteoFiles(const std::vector<std::string>& paths,
                                           int dense_features, int categorical_features) {
  CtrDataset dataset;
  dataset.dense_features = dense_features;
  dataset.categorical_features = categorical_features;
  for (const std::string& path : paths) {
    std::unique_ptr<gzFile_s, int (*)(gzFile)> file(gzopen(path.c_str(), "rb"), gzclose);
    if (file == nullptr) {
      return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
    }
    gzbuffer(file.get(), 1 << 20);
    const int64_t before = dataset.example_count;
    std::string line;
    int64_t line_number = 0;
    char chunk[1 << 16];
    bool pending = false;  // part of a line read, its newline not yet
    while (true) {
      if (gzgets(file.get(), chunk, sizeof(chunk)) == nullptr) break;
      line.append(chunk);
      if (line.empty() || line.back() != '\n') {
        pending = true;
        continue;  // a line longer than the chunk, or the last line without a newline
      }
      pending = false;
      line.pop_back();
      ++line_number;
      if (absl::Status parsed = ParseCriteoLine(line, &dataset); !parsed.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ":", line_number, ": ", parsed.message()));
      }
      line.clear();
    }
    int error = Z_OK;
    const char* message = gzerror(file.get(), &error);
    if (error != Z_OK && error != Z_STREAM_END) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": corrupt gzip stream: ", message));
    }
    if (pending && !line.empty()) {  // the last line, without a newline
      ++line_number;
      if (absl::Status parsed = ParseCriteoLine(line, &dataset); !parsed.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ":", line_number, ": ", parsed.message()));
      }
    }
    if (dataset.example_count == before) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": no examples"));
    }
  }
  return dataset;
}

}  // namespace paramserver
