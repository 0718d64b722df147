#include "worker/data_leaser.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"
#include "worker/batch_order.h"

namespace paramserver {
namespace {

constexpr absl::Duration kWaitLogInterval = absl::Seconds(5);
constexpr absl::Duration kLongestPoll = absl::Seconds(1);

}  // namespace

DataLeaser::DataLeaser(LeaseDataCall call, int64_t example_count, int batch_size, uint64_t seed,
                       bool shuffle)
    : call_(std::move(call)),
      example_count_(example_count),
      batch_size_(batch_size),
      seed_(seed),
      shuffle_(shuffle) {}

const std::vector<int64_t>& DataLeaser::OrderOf(int epoch) {
  if (epoch != order_epoch_) {
    order_ = EpochExampleOrder({0, example_count_}, epoch, seed_, shuffle_);
    order_epoch_ = epoch;
  }
  return order_;
}

absl::StatusOr<std::optional<LeasedChunk>> DataLeaser::Next(int64_t next_step,
                                                            const std::atomic<bool>* stop,
                                                            absl::Duration unavailable_timeout) {
  LeaseDataRequest request;
  request.set_example_count(example_count_);
  request.set_batch_size(batch_size_);
  request.set_next_step(next_step);
  request.set_acknowledged_lease_id(last_lease_id_);
  absl::Time last_answer = absl::Now();
  absl::Time next_log = absl::Now() + kWaitLogInterval;
  while (true) {
    if (stop != nullptr && stop->load()) {
      return absl::CancelledError(
          absl::StrCat("stopped while waiting for a data lease at step ", next_step));
    }
    absl::StatusOr<LeaseDataResponse> response = call_(request);
    absl::Duration pause = absl::Milliseconds(100);
    if (!response.ok()) {
      if (response.status().code() != absl::StatusCode::kUnavailable &&
          response.status().code() != absl::StatusCode::kDeadlineExceeded) {
        return response.status();
      }
      if (absl::Now() - last_answer > unavailable_timeout) {
        return absl::UnavailableError(absl::StrCat(
            "no data lease: the scheduler has not answered for ",
            absl::FormatDuration(unavailable_timeout), ": ", response.status().message()));
      }
    } else {
      last_answer = absl::Now();
      switch (response->outcome()) {
        case LEASE_DONE:
          return std::nullopt;
        case LEASE_GRANTED: {
          const DataLease& lease = response->lease();
          const int64_t usable = example_count_ / batch_size_ * batch_size_;
          if (lease.begin() < 0 || lease.end() > usable || lease.begin() >= lease.end() ||
              lease.begin() % batch_size_ != 0 || lease.end() % batch_size_ != 0 ||
              lease.epoch() < 0 || lease.first_step() < next_step) {
            return absl::InternalError(
                absl::StrCat("the scheduler leased positions [", lease.begin(), ", ", lease.end(),
                             ") of epoch ", lease.epoch(), " from step ", lease.first_step(),
                             ", which ", usable, " usable examples in batches of ", batch_size_,
                             " at step ", next_step, " cannot hold"));
          }
          last_lease_id_ = lease.lease_id();
          LeasedChunk chunk;
          chunk.lease = lease;
          const std::vector<int64_t>& order = OrderOf(lease.epoch());
          chunk.examples.assign(order.begin() + lease.begin(), order.begin() + lease.end());
          chunk.batches = (lease.end() - lease.begin()) / batch_size_;
          return chunk;
        }
        case LEASE_WAIT:
          pause = absl::Milliseconds(std::clamp(response->retry_after_ms(), 10, 1000));
          if (absl::Now() >= next_log) {
            spdlog::info("waiting for a data lease: {}", response->waiting_for());
            next_log = absl::Now() + kWaitLogInterval;
          }
          break;
        default:
          return absl::InternalError(absl::StrCat("the scheduler's lease answer has outcome ",
                                                  static_cast<int>(response->outcome())));
      }
    }
    absl::SleepFor(std::min(pause, kLongestPoll));
  }
}

void NoteTrainedBatch(int epoch, const int64_t* examples, int64_t count) {
  static const char* const log_path = std::getenv("PS_TEST_TRAINED_IDS_LOG");
  if (log_path == nullptr || *log_path == '\0') return;
  static const int fd = ::open(log_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
  static int64_t stop_after = [] {
    int64_t n = -1;
    const char* text = std::getenv("PS_TEST_STOP_AFTER_BATCHES");
    if (text == nullptr || !absl::SimpleAtoi(text, &n)) return int64_t{-1};
    return n;
  }();
  static int64_t written = 0;
  if (fd < 0) return;
  std::string line = absl::StrCat(epoch);
  for (int64_t i = 0; i < count; ++i) absl::StrAppend(&line, " ", examples[i]);
  line.push_back('\n');
  if (::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
    spdlog::error("PS_TEST_TRAINED_IDS_LOG: short write to {}", log_path);
  }
  if (++written == stop_after) std::raise(SIGSTOP);
}

}  // namespace paramserver
