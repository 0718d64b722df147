#include "worker/idx_dataset.h"

#include <zlib.h>

#include <limits>

#include "absl/strings/str_cat.h"
#include "common/base/status_macros.h"

namespace paramserver {
namespace {

uint32_t ReadBigEndian32(absl::string_view bytes, size_t offset) {
  uint32_t value = 0;
  for (int i = 0; i < 4; ++i) value = (value << 8) | static_cast<unsigned char>(bytes[offset + i]);
  return value;
}

// Checks the magic number and returns the dimensions of an IDX file of unsigned bytes.
absl::StatusOr<std::vector<uint32_t>> ParseIdxHeader(absl::string_view bytes,
                                                     absl::string_view source,
                                                     uint32_t expected_magic,
                                                     absl::string_view kind) {
  if (bytes.size() < 4 || ReadBigEndian32(bytes, 0) != expected_magic) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": not an IDX ", kind, " file (expected magic number 0x",
                     absl::Hex(expected_magic, absl::kZeroPad8), ")"));
  }
  const int dims = expected_magic & 0xff;
  if (bytes.size() < 4 + 4 * static_cast<size_t>(dims)) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": truncated IDX header"));
  }
  std::vector<uint32_t> shape;
  uint64_t body = 1;
  for (int d = 0; d < dims; ++d) {
    shape.push_back(ReadBigEndian32(bytes, 4 + 4 * d));
    if (shape.back() > (uint64_t{1} << 31)) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": IDX dimension ", d, " is ",
                                                     shape.back(), " (at most 2^31 accepted)"));
    }
    if (shape.back() != 0 && body > std::numeric_limits<uint64_t>::max() / shape.back()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": the IDX header's dimensions promise more than 2^64 bytes"));
    }
    body *= shape.back();
  }
  const uint64_t have = bytes.size() - 4 - 4 * dims;
  if (have != body) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": the header promises ", body, " bytes of data but the file has ",
                     have, have < body ? " (truncated)" : " (trailing bytes)"));
  }
  return shape;
}

}  // namespace

absl::StatusOr<LabeledDataset> ParseIdxImages(absl::string_view bytes, absl::string_view source) {
  PS_ASSIGN_OR_RETURN(std::vector<uint32_t> shape,
                      ParseIdxHeader(bytes, source, 0x00000803, "image"));
  LabeledDataset dataset;
  dataset.example_count = shape[0];
  dataset.feature_count = int64_t{shape[1]} * shape[2];  // each at most 2^31: no overflow
  const absl::string_view pixels = bytes.substr(16);
  dataset.features.resize(pixels.size());
  for (size_t i = 0; i < pixels.size(); ++i) {
    dataset.features[i] = static_cast<float>(static_cast<unsigned char>(pixels[i])) / 255.0f;
  }
  return dataset;
}

absl::StatusOr<std::vector<uint8_t>> ParseIdxLabels(absl::string_view bytes,
                                                    absl::string_view source) {
  PS_RETURN_IF_ERROR(ParseIdxHeader(bytes, source, 0x00000801, "label").status());
  const absl::string_view body = bytes.substr(8);
  return std::vector<uint8_t>(body.begin(), body.end());
}

absl::StatusOr<std::string> ReadMaybeGzippedFile(const std::string& path) {
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::string contents;
  char buffer[1 << 16];
  int read = 0;
  while ((read = gzread(file, buffer, sizeof(buffer))) > 0) contents.append(buffer, read);
  int error = Z_OK;
  const char* message = gzerror(file, &error);
  const std::string error_text = message != nullptr ? message : "";
  gzclose(file);
  if (read < 0 || (error != Z_OK && error != Z_STREAM_END)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": corrupt or truncated gzip data: ", error_text));
  }
  return contents;
}

absl::StatusOr<LabeledDataset> LoadIdxDataset(const std::string& images_path,
                                              const std::string& labels_path,
                                              int64_t expected_features, int num_classes) {
  PS_ASSIGN_OR_RETURN(std::string image_bytes, ReadMaybeGzippedFile(images_path));
  PS_ASSIGN_OR_RETURN(LabeledDataset dataset, ParseIdxImages(image_bytes, images_path));
  PS_ASSIGN_OR_RETURN(std::string label_bytes, ReadMaybeGzippedFile(labels_path));
  PS_ASSIGN_OR_RETURN(dataset.labels, ParseIdxLabels(label_bytes, labels_path));
  if (static_cast<int64_t>(dataset.labels.size()) != dataset.example_count) {
    return absl::InvalidArgumentError(absl::StrCat(labels_path, " has ", dataset.labels.size(),
                                                   " labels but ", images_path, " has ",
                                                   dataset.example_count, " images"));
  }
  if (dataset.feature_count != expected_features) {
    return absl::InvalidArgumentError(
        absl::StrCat(images_path, ": images have ", dataset.feature_count,
                     " pixels but the model's input layer has ", expected_features));
  }
  for (size_t i = 0; i < dataset.labels.size(); ++i) {
    if (dataset.labels[i] >= num_classes) {
      return absl::InvalidArgumentError(
          absl::StrCat(labels_path, ": label ", int{dataset.labels[i]}, " of example ", i,
                       " is not below the model's ", num_classes, " classes"));
    }
  }
  return dataset;
}

}  // namespace paramserver
