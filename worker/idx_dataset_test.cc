#include "worker/idx_dataset.h"

#include <zlib.h>

#include "catch2/catch.hpp"
#include "common/testing/temp_dir.h"

namespace paramserver {
namespace {

std::string BigEndian(uint32_t v) {
  return std::string{static_cast<char>(v >> 24), static_cast<char>(v >> 16),
                     static_cast<char>(v >> 8), static_cast<char>(v)};
}

std::string Images(uint32_t n, uint32_t rows, uint32_t cols, const std::string& pixels) {
  return BigEndian(0x803) + BigEndian(n) + BigEndian(rows) + BigEndian(cols) + pixels;
}

std::string Labels(const std::string& labels) {
  return BigEndian(0x801) + BigEndian(static_cast<uint32_t>(labels.size())) + labels;
}

std::string Gzip(const std::string& path, const std::string& contents) {
  gzFile file = gzopen(path.c_str(), "wb");
  gzwrite(file, contents.data(), static_cast<unsigned>(contents.size()));
  gzclose(file);
  return path;
}

TEST_CASE("IDX images parse into [0,1] features") {
  absl::StatusOr<LabeledDataset> d =
      ParseIdxImages(Images(2, 1, 2, std::string("\x00\xff\x33\x66", 4)), "x");
  REQUIRE(d.ok());
  CHECK(d->example_count == 2);
  CHECK(d->feature_count == 2);
  CHECK(d->features == std::vector<float>{0.0f, 1.0f, 0x33 / 255.0f, 0x66 / 255.0f});
}

TEST_CASE("every pixel of a large image file becomes its value over 255") {
  // Past several of the conversion's blocks (4096 pixels), ending in a partial one.
  std::string pixels;
  for (int i = 0; i < 10003; ++i) pixels.push_back(static_cast<char>(i * 7919 % 256));
  absl::StatusOr<LabeledDataset> d = ParseIdxImages(Images(1, 7, 1429, pixels), "x");
  REQUIRE(d.ok());
  REQUIRE(d->features.size() == pixels.size());
  for (size_t i = 0; i < pixels.size(); ++i) {
    INFO("pixel " << i);
    CHECK(d->features[i] == static_cast<float>(static_cast<unsigned char>(pixels[i])) / 255.0f);
  }
}

TEST_CASE("truncated, padded and foreign IDX files are rejected with the reason") {
  auto error = [](absl::StatusOr<LabeledDataset> d) {
    REQUIRE_FALSE(d.ok());
    CHECK(d.status().code() == absl::StatusCode::kInvalidArgument);
    return std::string(d.status().message());
  };
  CHECK(error(ParseIdxImages(Images(2, 2, 2, "1234567"), "img")) ==
        "img: the header promises 8 bytes of data but the file has 7 (truncated)");
  CHECK(error(ParseIdxImages(Images(1, 1, 1, "12"), "img")).find("(trailing bytes)") !=
        std::string::npos);
  CHECK(error(ParseIdxImages(Labels("12"), "img")).find("img: not an IDX image file") == 0);
  CHECK(error(ParseIdxImages(BigEndian(0x803) + "\x00", "img")) == "img: truncated IDX header");
  CHECK(error(ParseIdxImages("", "img")).find("not an IDX image file") != std::string::npos);
  CHECK_FALSE(ParseIdxLabels(Images(1, 1, 1, "1"), "lbl").ok());
  // Found by tests/fuzz: a dimension past 2^31, and dimensions whose product overflows.
  CHECK(error(ParseIdxImages(Images(2, 0x80000001u, 1, ""), "img")) ==
        "img: IDX dimension 1 is 2147483649 (at most 2^31 accepted)");
  CHECK(error(ParseIdxImages(Images(0x80000000u, 0x80000000u, 0x80000000u, ""), "img")) ==
        "img: the IDX header's dimensions promise more than 2^64 bytes");
}

TEST_CASE("LoadIdxDataset reads gzip'd and plain files and checks they agree") {
  TempDir dir;
  const std::string images = Gzip(dir.File("i.gz"), Images(3, 2, 2, std::string(12, '\x10')));
  const std::string labels = dir.WriteFile("l", Labels(std::string("\x01\x00\x02", 3)));
  absl::StatusOr<LabeledDataset> d = LoadIdxDataset(images, labels, 4, 3);
  REQUIRE(d.ok());
  CHECK(d->labels == std::vector<uint8_t>{1, 0, 2});

  CHECK(std::string(LoadIdxDataset(images, labels, 5, 3).status().message())
            .find("model's input layer has 5") != std::string::npos);
  CHECK(std::string(LoadIdxDataset(images, labels, 4, 2).status().message())
            .find("label 2 of example 2") != std::string::npos);
  const std::string two_labels = dir.WriteFile("l2", Labels(std::string("\x01\x00", 2)));
  CHECK(std::string(LoadIdxDataset(images, two_labels, 4, 3).status().message())
            .find("has 2 labels but") != std::string::npos);
  CHECK(LoadIdxDataset(dir.File("absent"), labels, 4, 3).status().code() ==
        absl::StatusCode::kNotFound);
}

TEST_CASE("a truncated gzip stream is an error, not a short dataset") {
  TempDir dir;
  std::string pixels;
  for (int i = 0; i < 4000; ++i) pixels.push_back(static_cast<char>(i * 7919 % 251));
  const std::string whole = Gzip(dir.File("whole.gz"), Images(1000, 2, 2, pixels));
  std::string bytes;
  {
    absl::StatusOr<std::string> raw = ReadMaybeGzippedFile(whole);
    REQUIRE(raw.ok());
    REQUIRE(raw->size() == 16 + 4000);
  }
  FILE* f = std::fopen(whole.c_str(), "rb");
  char buffer[1 << 16];
  bytes.assign(buffer, std::fread(buffer, 1, sizeof(buffer), f));
  std::fclose(f);
  const std::string cut = dir.WriteFile("cut.gz", bytes.substr(0, bytes.size() / 2));
  absl::StatusOr<std::string> read = ReadMaybeGzippedFile(cut);
  if (read.ok()) {
    // zlib may return the inflated prefix without an error; the IDX size check catches it.
    CHECK_FALSE(ParseIdxImages(*read, cut).ok());
  } else {
    CHECK(std::string(read.status().message()).find("corrupt or truncated gzip") !=
          std::string::npos);
  }
}

// The file's bytes.
std::string BytesOf(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "rb");
  REQUIRE(f != nullptr);
  std::string bytes;
  char buffer[1 << 12];
  for (size_t got; (got = std::fread(buffer, 1, sizeof(buffer), f)) > 0;) bytes.append(buffer, got);
  std::fclose(f);
  return bytes;
}

TEST_CASE("the size reserved for a file's contents is a capped hint, never the trailer's word") {
  TempDir dir;
  const std::string images = Images(2, 1, 2, std::string("\x00\xff\x33\x66", 4));
  const std::string gzipped = Gzip(dir.File("images.gz"), images);
  CHECK(ExpectedContentSize(gzipped) == images.size());  // ISIZE
  CHECK(ExpectedContentSize(dir.WriteFile("plain", images)) == images.size());
  CHECK(ExpectedContentSize(dir.WriteFile("short", "\x1f\x8b")) == 2);  // too short for gzip
  CHECK(ExpectedContentSize(dir.WriteFile("empty", "")) == 0);
  CHECK(ExpectedContentSize(dir.File("missing")) == 0);
  CHECK(ExpectedContentSize(dir.path()) == 0);  // a directory (its size would read as 2^63)

  // A trailer that claims 4 GiB: capped at 1032 times the file's size.
  std::string lying = BytesOf(gzipped);
  lying.replace(lying.size() - 4, 4, std::string(4, '\xff'));
  const std::string lying_path = dir.WriteFile("lying.gz", lying);
  CHECK(ExpectedContentSize(lying_path) == 1032 * lying.size());
  // And zlib's own length check refuses the file.
  absl::StatusOr<std::string> read = ReadMaybeGzippedFile(lying_path);
  REQUIRE_FALSE(read.ok());
  CHECK(std::string(read.status().message()).find("corrupt or truncated gzip") !=
        std::string::npos);

  // Two gzip members, read as one stream: the last member's size is an underestimate
  // (the contents grow past it), and every byte is read.
  const std::string two_members =
      dir.WriteFile("two.gz", BytesOf(gzipped) + BytesOf(Gzip(dir.File("labels.gz"), "ab")));
  CHECK(ExpectedContentSize(two_members) == 2);
  absl::StatusOr<std::string> both = ReadMaybeGzippedFile(two_members);
  REQUIRE(both.ok());
  CHECK(*both == images + "ab");
}

TEST_CASE("a data path that is a directory is an error, not a crash") {
  TempDir dir;
  absl::StatusOr<std::string> read = ReadMaybeGzippedFile(dir.path());
  CHECK_FALSE(read.ok());
  CHECK_FALSE(LoadIdxDataset(dir.path(), dir.path(), 4, 10).ok());
}

}  // namespace
}  // namespace paramserver
