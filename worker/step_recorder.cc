#include "worker/step_recorder.h"

#include <algorithm>
#include <cmath>

#include "spdlog/spdlog.h"

namespace paramserver {

StepRecorder::StepRecorder(int64_t start_step, int64_t total_steps, int batch_size,
                           absl::Duration log_interval, ScalarSink on_scalar)
    : total_steps_(total_steps),
      batch_size_(batch_size),
      log_interval_(log_interval),
      on_scalar_(std::move(on_scalar)) {
  absl::MutexLock lock(&mu_);
  progress_.set_step(start_step);
  progress_.set_total_steps(total_steps);
}

namespace {

constexpr double kStepTimeBase = 1e-6;    // seconds: bucket 0's lower edge
constexpr double kStepTimeGrowth = 1.02;  // each bucket 2% wider than the one before
constexpr int kStepTimeBuckets = 1400;    // up to ~1e6 s

int StepTimeBucket(double seconds) {
  if (seconds <= kStepTimeBase) return 0;
  const int bucket =
      static_cast<int>(std::log(seconds / kStepTimeBase) / std::log(kStepTimeGrowth));
  return std::min(bucket, kStepTimeBuckets - 1);
}

}  // namespace

absl::Duration StepRecorder::Record(int64_t step, int epoch, float loss, absl::Time start,
                                    TrainingSummary* summary, int64_t samples, bool timed) {
  summary->steps = step + 1;
  ++summary->steps_run;
  timed = timed && summary->steps_run > 1;
  const absl::Time end = absl::Now();
  const absl::Duration took =
      end - (last_step_end_ == absl::InfinitePast() ? start : last_step_end_);
  last_step_end_ = end;
  if (timed) {
    const double step_seconds = absl::ToDoubleSeconds(took);
    if (step_time_buckets_.empty()) step_time_buckets_.assign(kStepTimeBuckets, 0);
    ++step_time_buckets_[StepTimeBucket(step_seconds)];
    if (step_seconds > summary->longest_step_seconds) {
      summary->longest_step_seconds = step_seconds;
      summary->longest_step = step;
    }
    ++timed_steps_;
    int64_t seen = 0;
    const int64_t half = (timed_steps_ + 1) / 2;
    // The median's bucket, at its geometric middle (only when asked: every 64 steps and
    // the first few, so a step costs O(1) amortised).
    if (timed_steps_ <= 64 || timed_steps_ % 64 == 0) {
      for (int k = 0; k < kStepTimeBuckets; ++k) {
        seen += step_time_buckets_[k];
        if (seen >= half) {
          summary->median_step_seconds = kStepTimeBase * std::pow(kStepTimeGrowth, k + 0.5);
          break;
        }
      }
    }
  }
  summary->samples += samples >= 0 ? samples : batch_size_;
  summary->last_loss = loss;
  ++steps_since_log_;
  loss_since_log_ += loss;
  const absl::Time now = absl::Now();
  if (last_log_ == absl::InfinitePast()) last_log_ = start;
  const double seconds = std::max(1e-9, absl::ToDoubleSeconds(now - start));
  const double samples_per_sec = summary->samples / seconds;
  {
    absl::MutexLock lock(&mu_);
    progress_.set_step(step + 1);
    progress_.set_epoch(epoch);
    // The scheduler keeps only finite figures (a heartbeat with others is answered but
    // not kept): a diverged step's NaN/Inf loss leaves the last finite one shown; the
    // worker's own log shows it as it is.
    if (std::isfinite(loss)) progress_.set_loss(loss);
    progress_.set_samples_per_sec(samples_per_sec);
    progress_.set_samples(summary->samples);
    progress_.set_training_seconds(seconds);
    progress_.set_steps_per_sec(summary->steps_run / seconds);
    progress_.set_total_steps(total_steps_);
  }
  if (now - last_log_ >= log_interval_ || step + 1 == total_steps_) {
    if (total_steps_ > 0) {
      spdlog::info("epoch {} step {}/{} loss {:.4f} samples/s {:.0f}", epoch, step + 1,
                   total_steps_, loss_since_log_ / steps_since_log_, samples_per_sec);
    } else {
      spdlog::info("step {} loss {:.4f} samples/s {:.0f}", step + 1,
                   loss_since_log_ / steps_since_log_, samples_per_sec);
    }
    if (on_scalar_) {
      on_scalar_("loss", step + 1, loss_since_log_ / steps_since_log_);
      on_scalar_("samples_per_sec", step + 1, samples_per_sec);
    }
    last_log_ = now;
    steps_since_log_ = 0;
    loss_since_log_ = 0;
  }
  return took;
}

void StepRecorder::Update(const std::function<void(NodeProgress*)>& change) {
  absl::MutexLock lock(&mu_);
  change(&progress_);
}

NodeProgress StepRecorder::progress() const {
  absl::MutexLock lock(&mu_);
  return progress_;
}

}  // namespace paramserver
