#include "tools/ctr_data.h"

#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/deterministic_random.h"
#include "worker/ctr_metrics.h"

namespace paramserver {
namespace {

// A deterministic draw for (seed, stream, a, b).
uint64_t Hash(uint64_t seed, uint64_t stream, uint64_t a, uint64_t b = 0) {
  return SplitMix64(SplitMix64(SplitMix64(SplitMix64(seed) ^ stream) ^ a) ^ b);
}

enum Stream : uint64_t {
  kDenseCoefficient = 1,
  kCategoricalWeight,
  kRankToId,
  kDenseValue,
  kRank,
  kMissing,
  kLabel,
};

// Writes lines to a plain or gzip'd file.
class LineWriter {
 public:
  static absl::StatusOr<std::unique_ptr<LineWriter>> Open(const std::string& path) {
    std::unique_ptr<LineWriter> writer(new LineWriter);
    writer->path_ = path;
    if (absl::EndsWith(path, ".gz")) {
      writer->gz_ = gzopen(path.c_str(), "wb6");
      if (writer->gz_ == nullptr) return Unwritable(path);
    } else {
      writer->plain_ = std::fopen(path.c_str(), "wb");
      if (writer->plain_ == nullptr) return Unwritable(path);
    }
    return writer;
  }
  absl::Status Write(const std::string& line) {
    const bool ok = gz_ != nullptr
                        ? gzwrite(gz_, line.data(), line.size()) == static_cast<int>(line.size())
                        : std::fwrite(line.data(), 1, line.size(), plain_) == line.size();
    return ok ? absl::OkStatus() : Unwritable(path_);
  }
  absl::Status Close() {
    bool ok = true;
    if (gz_ != nullptr) ok = gzclose(gz_) == Z_OK;
    if (plain_ != nullptr) ok = std::fclose(plain_) == 0;
    gz_ = nullptr;
    plain_ = nullptr;
    return ok ? absl::OkStatus() : Unwritable(path_);
  }
  ~LineWriter() { Close().IgnoreError(); }

 private:
  static absl::Status Unwritable(const std::string& path) {
    return absl::UnavailableError(absl::StrCat(path, ": cannot write: ", std::strerror(errno)));
  }
  std::string path_;
  gzFile gz_ = nullptr;
  FILE* plain_ = nullptr;
};

// The hidden model the labels are drawn from: ids by a Zipf law, a weight per dense
// feature and per id.
struct PlantedModel {
  std::vector<double> cdf;  // the Zipf law's cumulative distribution over ranks 1..vocabulary
  std::vector<double> dense_coefficient;
  double categorical_scale = 0;
};

PlantedModel PlantModel(const CtrDataOptions& options) {
  const uint64_t seed = options.seed;
  PlantedModel model;
  model.cdf.resize(options.vocabulary);
  double total = 0;
  for (int64_t r = 0; r < options.vocabulary; ++r) {
    total += 1 / std::pow(static_cast<double>(r + 1), options.zipf_exponent);
    model.cdf[r] = total;
  }
  for (double& c : model.cdf) c /= total;
  model.dense_coefficient.resize(options.dense_features);
  for (int j = 0; j < options.dense_features; ++j) {
    model.dense_coefficient[j] = 0.3 * StandardNormal(Hash(seed, kDenseCoefficient, j, 0),
                                                      Hash(seed, kDenseCoefficient, j, 1));
  }
  model.categorical_scale = 1.2 / std::sqrt(static_cast<double>(options.categorical_features));
  return model;
}

// Example `example`'s line (with its newline) and the planted model's logit for it.
std::string ExampleLine(const CtrDataOptions& options, const PlantedModel& model, uint64_t example,
                        double* logit_out) {
  const uint64_t seed = options.seed;
  double logit = -1.2;
  std::string dense_text, categorical_text;
  for (int j = 0; j < options.dense_features; ++j) {
    absl::StrAppend(&dense_text, "\t");
    if (UnitUniform(Hash(seed, kMissing, example, j)) < options.missing_rate) continue;
    const double draw = StandardNormal(Hash(seed, kDenseValue, example, 2 * j),
                                       Hash(seed, kDenseValue, example, 2 * j + 1));
    int64_t value = static_cast<int64_t>(std::floor(std::exp(1.5 + 1.2 * draw))) - 1;
    if (UnitUniform(Hash(seed, kDenseValue, example, 1000 + j)) < 0.02) value = -1;
    absl::StrAppend(&dense_text, value);
    logit += model.dense_coefficient[j] *
             std::log1p(static_cast<double>(std::max<int64_t>(value, 0))) / 4;
  }
  for (int k = 0; k < options.categorical_features; ++k) {
    absl::StrAppend(&categorical_text, "\t");
    if (UnitUniform(Hash(seed, kMissing, example, 1000 + k)) < options.missing_rate) continue;
    const double u = UnitUniform(Hash(seed, kRank, example, k));
    const int64_t rank =
        std::lower_bound(model.cdf.begin(), model.cdf.end(), u) - model.cdf.begin();
    const uint32_t id = static_cast<uint32_t>(Hash(seed, kRankToId, k, rank));
    absl::StrAppend(&categorical_text, absl::StrFormat("%08x", id));
    logit += model.categorical_scale *
             StandardNormal(Hash(seed, kCategoricalWeight, k, 2 * uint64_t{id}),
                            Hash(seed, kCategoricalWeight, k, 2 * uint64_t{id} + 1));
  }
  const double probability = 1 / (1 + std::exp(-logit));
  const int label = UnitUniform(Hash(seed, kLabel, example)) < probability ? 1 : 0;
  *logit_out = logit;
  return absl::StrCat(label, dense_text, categorical_text, "\n");
}

}  // namespace

absl::StatusOr<CtrDataSummary> WriteCtrData(const CtrDataOptions& options,
                                            const std::string& train_path,
                                            const std::string& test_path) {
  if (options.train_examples < 1 || options.test_examples < 1 || options.dense_features < 0 ||
      options.categorical_features < 1 || options.vocabulary < 1 ||
      options.vocabulary > (int64_t{1} << 28) || !(options.zipf_exponent > 0) ||
      !(options.missing_rate >= 0 && options.missing_rate < 1)) {
    return absl::InvalidArgumentError(
        "ctr data: train and test examples must be >= 1, dense features >= 0, categorical "
        "features >= 1, the vocabulary in [1, 2^28], the Zipf exponent > 0 and the missing "
        "rate in [0, 1)");
  }
  const PlantedModel model = PlantModel(options);
  CtrDataSummary summary;
  for (const bool test : {false, true}) {
    const std::string& path = test ? test_path : train_path;
    const int64_t examples = test ? options.test_examples : options.train_examples;
    absl::StatusOr<std::unique_ptr<LineWriter>> writer = LineWriter::Open(path);
    if (!writer.ok()) return writer.status();
    std::vector<float> logits, labels;
    for (int64_t n = 0; n < examples; ++n) {
      const uint64_t example = (test ? uint64_t{1} << 62 : 0) + n;
      double logit = 0;
      const std::string line = ExampleLine(options, model, example, &logit);
      if (absl::Status written = (*writer)->Write(line); !written.ok()) return written;
      if (test) {
        logits.push_back(static_cast<float>(logit));
        labels.push_back(static_cast<float>(line[0] - '0'));
      }
    }
    if (absl::Status closed = (*writer)->Close(); !closed.ok()) return closed;
    if (test) {
      absl::StatusOr<double> auc = ExactAuc(logits, labels);
      if (!auc.ok()) return auc.status();
      summary.best_test_auc = *auc;
      double positives = 0;
      for (float label : labels) positives += label;
      summary.test_positive_rate = positives / static_cast<double>(labels.size());
    }
  }
  summary.train_examples = options.train_examples;
  summary.test_examples = options.test_examples;
  return summary;
}

}  // namespace paramserver
