#include "worker/idx_dataset.h"

#include <sys/stat.h>
#include <zlib.h>

#include <algorithm>
#include <fstream>
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
  // Built from the pixels in one pass, a block at a time through a buffer the compiler
  // vectorises: resize() would first zero every float (188 MB for Fashion-MNIST's
  // training set) on the worker's way to registering.
  dataset.features.reserve(pixels.size());
  constexpr size_t kBlock = 4096;
  float block[kBlock];
  for (size_t begin = 0; begin < pixels.size(); begin += kBlock) {
    const size_t count = std::min(kBlock, pixels.size() - begin);
    const auto* from = reinterpret_cast<const unsigned char*>(pixels.data() + begin);
    for (size_t i = 0; i < count; ++i) block[i] = static_cast<float>(from[i]) / 255.0f;
    dataset.features.insert(dataset.features.end(), block, block + count);
  }
  return dataset;
}

absl::StatusOr<std::vector<uint8_t>> ParseIdxLabels(absl::string_view bytes,
                                                    absl::string_view source) {
  PS_RETURN_IF_ERROR(ParseIdxHeader(bytes, source, 0x00000801, "label").status());
  const absl::string_view body = bytes.substr(8);
  return std::vector<uint8_t>(body.begin(), body.end());
}

size_t ExpectedContentSize(const std::string& path) {
  constexpr uint64_t kMaxHint = uint64_t{1} << 30;
  struct stat info;
  if (::stat(path.c_str(), &info) != 0 || !S_ISREG(info.st_mode) || info.st_size <= 0) return 0;
  const uint64_t size = static_cast<uint64_t>(info.st_size);
  std::ifstream in(path, std::ios::binary);
  unsigned char head[2] = {0, 0};
  if (size < 18 || !in.read(reinterpret_cast<char*>(head), 2) || head[0] != 0x1f ||
      head[1] != 0x8b) {
    return static_cast<size_t>(std::min(size, kMaxHint));  // not gzip (or too short to be)
  }
  unsigned char tail[4] = {0, 0, 0, 0};
  if (!in.seekg(static_cast<std::streamoff>(size - 4)).read(reinterpret_cast<char*>(tail), 4)) {
    return 0;
  }
  const uint64_t claimed = uint32_t{tail[0]} | uint32_t{tail[1]} << 8 | uint32_t{tail[2]} << 16 |
                           uint32_t{tail[3]} << 24;
  return static_cast<size_t>(std::min({claimed, 1032 * size, kMaxHint}));
}

absl::StatusOr<std::string> ReadMaybeGzippedFile(const std::string& path) {
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::string contents;
  // Sized once from what the file says it holds, so the contents are not copied as they
  // grow: only a hint, never trusted further.
  contents.reserve(ExpectedContentSize(path));
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
