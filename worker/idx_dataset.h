// Reading labelled image sets in the IDX format (MNIST, Fashion-MNIST), gzip'd or not.
#ifndef PARAMSERVER_WORKER_IDX_DATASET_H_
#define PARAMSERVER_WORKER_IDX_DATASET_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace paramserver {

// Examples stored row-major: example i's features are
// features[i * feature_count, (i + 1) * feature_count), scaled to [0, 1].
struct LabeledDataset {
  int64_t example_count = 0;
  int64_t feature_count = 0;
  std::vector<float> features;
  std::vector<uint8_t> labels;
};

// Parses an IDX image file's bytes (magic 0x00000803, uint8 pixels, n x rows x cols).
// INVALID_ARGUMENT naming `source` for a bad magic number, a truncated body, or trailing bytes.
absl::StatusOr<LabeledDataset> ParseIdxImages(absl::string_view bytes, absl::string_view source);

// Parses an IDX label file's bytes (magic 0x00000801, uint8 labels).
absl::StatusOr<std::vector<uint8_t>> ParseIdxLabels(absl::string_view bytes,
                                                    absl::string_view source);

// Reads a file whole, inflating it if it is gzip'd. NOT_FOUND if it cannot be opened;
// INVALID_ARGUMENT for a corrupt or truncated gzip stream (or a path that is no file).
absl::StatusOr<std::string> ReadMaybeGzippedFile(const std::string& path);

// How many bytes ReadMaybeGzippedFile(path) should give, to reserve them at once: a
// gzip file's ISIZE (its last 4 bytes, little-endian: the size of its last member,
// modulo 2^32), any other regular file's size; 0 for anything else (missing, a
// directory, unreadable). A hint, never trusted: at most 1 GiB, and for gzip at most
// deflate's largest ratio (1032:1) times the file's size, so a file whose trailer lies
// costs no more than a plausible one.
size_t ExpectedContentSize(const std::string& path);

// Loads images and labels and checks they agree: the same count, every label below
// `num_classes`, and feature_count == `expected_features`. Errors name the file.
absl::StatusOr<LabeledDataset> LoadIdxDataset(const std::string& images_path,
                                              const std::string& labels_path,
                                              int64_t expected_features, int num_classes);

}  // namespace paramserver

#endif  // PARAMSERVER_WORKER_IDX_DATASET_H_
