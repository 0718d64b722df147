#include "worker/tensorboard_writer.h"

#include <unistd.h>

#include <array>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "proto/tensorboard_event.pb.h"

namespace paramserver {
namespace {

// The reflected Castagnoli polynomial's table, built once.
const std::array<uint32_t, 256>& Crc32cTable() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t crc = i;
      for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1) ? 0x82F63B78u : 0u);
      t[i] = crc;
    }
    return t;
  }();
  return table;
}

void AppendLittleEndian(uint64_t value, int bytes, std::string* out) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

double WallTimeNow() { return absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()); }

}  // namespace

uint32_t Crc32c(absl::string_view data) {
  const std::array<uint32_t, 256>& table = Crc32cTable();
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char byte : data) crc = table[(crc ^ byte) & 0xff] ^ (crc >> 8);
  return crc ^ 0xFFFFFFFFu;
}

uint32_t MaskedCrc32c(absl::string_view data) {
  const uint32_t crc = Crc32c(data);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string FrameRecord(absl::string_view data) {
  std::string length;
  AppendLittleEndian(data.size(), 8, &length);
  std::string record = length;
  AppendLittleEndian(MaskedCrc32c(length), 4, &record);
  record.append(data.data(), data.size());
  AppendLittleEndian(MaskedCrc32c(data), 4, &record);
  return record;
}

absl::StatusOr<std::unique_ptr<TensorBoardWriter>> TensorBoardWriter::Create(
    const std::string& dir) {
  FileSystem& fs = LocalFileSystem();
  // A folder that cannot be made is named by the failure to open the file below.
  CreateDirRecursively(fs, dir).IgnoreError();
  char host[256] = "localhost";
  gethostname(host, sizeof(host) - 1);
  const std::string path = absl::StrCat(dir, "/events.out.tfevents.",
                                        absl::ToUnixSeconds(absl::Now()), ".", host, ".", getpid());
  absl::StatusOr<std::unique_ptr<WritableFile>> out = fs.NewAppendableFile(path);
  if (!out.ok()) {
    return absl::UnavailableError(
        absl::StrCat("cannot write the TensorBoard event file: ", out.status().message()));
  }
  std::unique_ptr<TensorBoardWriter> writer(new TensorBoardWriter(path, *std::move(out)));
  tensorboard::Event version;
  version.set_wall_time(WallTimeNow());
  version.set_file_version("brain.Event:2");
  absl::Status written = writer->WriteEvent(version.SerializeAsString());
  if (!written.ok()) return written;
  return writer;
}

absl::Status TensorBoardWriter::WriteScalar(const std::string& tag, int64_t step, double value) {
  tensorboard::Event event;
  event.set_wall_time(WallTimeNow());
  event.set_step(step);
  tensorboard::SummaryValue* scalar = event.mutable_summary()->add_value();
  scalar->set_tag(tag);
  scalar->set_simple_value(static_cast<float>(value));
  return WriteEvent(event.SerializeAsString());
}

absl::Status TensorBoardWriter::WriteEvent(const std::string& serialized) {
  absl::MutexLock lock(&mu_);
  const absl::Status written = out_->Append(FrameRecord(serialized));
  if (!written.ok()) {
    return absl::UnavailableError(
        absl::StrCat("cannot write to the TensorBoard event file: ", written.message()));
  }
  return absl::OkStatus();
}

}  // namespace paramserver
