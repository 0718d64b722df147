#include "worker/tensorboard_writer.h"

#include <fstream>
#include <sstream>

#include "catch2/catch.hpp"
#include "common/testing/local_cluster.h"
#include "common/testing/temp_dir.h"

namespace paramserver {
namespace {

TEST_CASE("CRC-32C matches the published check values") {
  CHECK(Crc32c("123456789") == 0xE3069283u);              // the standard check value
  CHECK(Crc32c(std::string(32, '\0')) == 0x8A9136AAu);    // RFC 3720 B.4: 32 zero bytes
  CHECK(Crc32c(std::string(32, '\xff')) == 0x62A8AB43u);  // RFC 3720 B.4: 32 0xff bytes
  std::string ascending;
  for (int i = 0; i < 32; ++i) ascending.push_back(static_cast<char>(i));
  CHECK(Crc32c(ascending) == 0x46DD794Eu);  // RFC 3720 B.4: 0x00..0x1f
  // TFRecord's mask, by hand: crc 0xE3069283 rotated right by 15, plus 0xa282ead8.
  CHECK(MaskedCrc32c("123456789") == ((0xE3069283u >> 15 | 0xE3069283u << 17) + 0xa282ead8u));
}

TEST_CASE("a record is the length, its masked CRC, the data and its masked CRC") {
  const std::string record = FrameRecord("abc");
  REQUIRE(record.size() == 8 + 4 + 3 + 4);
  CHECK(record.substr(0, 8) == std::string("\x03\0\0\0\0\0\0\0", 8));
  const uint32_t length_crc = MaskedCrc32c(record.substr(0, 8));
  CHECK(record.substr(8, 4) == std::string(reinterpret_cast<const char*>(&length_crc), 4));
  CHECK(record.substr(12, 3) == "abc");
  const uint32_t data_crc = MaskedCrc32c("abc");
  CHECK(record.substr(15, 4) == std::string(reinterpret_cast<const char*>(&data_crc), 4));
}

TEST_CASE("an event file reads back, CRCs and all, with an independent reader") {
  TempDir dir;
  absl::StatusOr<std::unique_ptr<TensorBoardWriter>> writer =
      TensorBoardWriter::Create(dir.File("run/worker-0"));
  REQUIRE(writer.ok());
  CHECK((*writer)->path().find(dir.File("run/worker-0") + "/events.out.tfevents.") == 0);
  REQUIRE((*writer)->WriteScalar("loss", 100, 0.5).ok());
  REQUIRE((*writer)->WriteScalar("test_accuracy", 937, 0.8125).ok());
  REQUIRE((*writer)->WriteScalar("samples_per_sec", 1000, 15000).ok());
  const std::string out = dir.File("reader.out");
  const std::string command = "/usr/bin/python3 '" +
                              RunfilePath("worker/tensorboard_reference.py") + "' '" +
                              (*writer)->path() + "' > '" + out + "' 2>&1";
  const int code = std::system(command.c_str());
  std::ifstream in(out);
  std::stringstream printed;
  printed << in.rdbuf();
  INFO(printed.str());
  CHECK(code == 0);
  CHECK(printed.str() ==
        "version brain.Event:2\n"
        "scalar loss 100 0.5\n"
        "scalar test_accuracy 937 0.8125\n"
        "scalar samples_per_sec 1000 15000\n");
}

TEST_CASE("an unwritable folder is refused with the path") {
  absl::StatusOr<std::unique_ptr<TensorBoardWriter>> writer =
      TensorBoardWriter::Create("/proc/no/such/dir");
  CHECK(writer.status().code() == absl::StatusCode::kUnavailable);
  CHECK(std::string(writer.status().message()).find("/proc/no/such/dir/events.out.tfevents.") !=
        std::string::npos);
}

}  // namespace
}  // namespace paramserver
