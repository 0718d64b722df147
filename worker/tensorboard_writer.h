// Training curves as TensorBoard event files: TFRecord framing (length, masked CRC-32C
// of the length, the record, masked CRC-32C of the record) around Event protos with
// scalar summaries, so that `tensorboard --logdir DIR` shows loss, accuracy and samples/s.
#ifndef PARAMSERVER_WORKER_TENSORBOARD_WRITER_H_
#define PARAMSERVER_WORKER_TENSORBOARD_WRITER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/files/file_system.h"

namespace paramserver {

// CRC-32C (Castagnoli) of `data`, as iSCSI (RFC 3720) and TFRecord use it.
uint32_t Crc32c(absl::string_view data);
// TFRecord's masked CRC: ((crc >> 15) | (crc << 17)) + 0xa282ead8.
uint32_t MaskedCrc32c(absl::string_view data);
// One TFRecord: the little-endian uint64 length, its masked CRC, the data, its masked CRC.
std::string FrameRecord(absl::string_view data);

// Thread-safe. Appends to one event file, flushed after every write.
class TensorBoardWriter {
 public:
  // Creates `dir` if needed and opens `dir/events.out.tfevents.<seconds>.<host>.<pid>`,
  // writing the file-version event. UNAVAILABLE naming the path if it cannot be written.
  static absl::StatusOr<std::unique_ptr<TensorBoardWriter>> Create(const std::string& dir);

  // One scalar point of curve `tag` at `step`, stamped with the wall time now.
  absl::Status WriteScalar(const std::string& tag, int64_t step, double value)
      ABSL_LOCKS_EXCLUDED(mu_);

  const std::string& path() const { return path_; }

 private:
  TensorBoardWriter(std::string path, std::unique_ptr<WritableFile> out)
      : path_(std::move(path)), out_(std::move(out)) {}
  absl::Status WriteEvent(const std::string& serialized) ABSL_LOCKS_EXCLUDED(mu_);

  const std::string path_;
  absl::Mutex mu_;
  const std::unique_ptr<WritableFile> out_ ABSL_GUARDED_BY(mu_);
};

}  // namespace paramserver

#endif  // PARAMSERVER_WORKER_TENSORBOARD_WRITER_H_
