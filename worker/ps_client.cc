#include "worker/ps_client.h"

#include <algorithm>

#include "absl/time/clock.h"

namespace paramserver {
namespace {

// Holds everything back until Finish: one ordinary push.
class PushAtFinish final : public StreamedPush {
 public:
  PushAtFinish(PsClient* client, const StepPush& push) : client_(client), push_(push) {}

  void Ready(int64_t /*from*/) override {}
  int64_t early_buckets() const override { return 0; }
  absl::StatusOr<bool> Finish() override { return client_->Push(push_); }

 private:
  PsClient* const client_;
  const StepPush push_;
};

}  // namespace

std::unique_ptr<StreamedPush> PsClient::StartStreamedPush(const StepPush& push) {
  return std::make_unique<PushAtFinish>(this, push);
}

absl::StatusOr<ShardMapUpdate> PsClient::AwaitShardMapChange(absl::Duration wait) {
  absl::SleepFor(std::min(wait, absl::Milliseconds(50)));
  return RefreshShardMap();
}

}  // namespace paramserver
