#include "worker/ps_client.h"

namespace paramserver {
namespace {

// Holds everything back until Finish: one ordinary push.
class PushAtFinish final : public StreamedPush {
 public:
  PushAtFinish(PsClient* client, int64_t step, absl::Span<const float> gradient,
               absl::Span<float> next_params)
      : client_(client), step_(step), gradient_(gradient), next_params_(next_params) {}

  void Ready(int64_t /*from*/) override {}
  int64_t early_buckets() const override { return 0; }

  absl::StatusOr<bool> Finish() override {
    if (next_params_.empty()) {
      absl::Status pushed = client_->PushAll(step_, gradient_);
      if (!pushed.ok()) return pushed;
      return false;
    }
    return client_->PushAllAndPullNext(step_, gradient_, next_params_);
  }

 private:
  PsClient* const client_;
  const int64_t step_;
  const absl::Span<const float> gradient_;
  const absl::Span<float> next_params_;
};

}  // namespace

std::unique_ptr<StreamedPush> PsClient::StartStreamedPush(int64_t step,
                                                          absl::Span<const float> gradient,
                                                          absl::Span<float> next_params) {
  return std::make_unique<PushAtFinish>(this, step, gradient, next_params);
}

absl::Status PsClient::PullWithRows(int64_t, absl::Span<float>,
                                    const std::vector<std::vector<int64_t>>&,
                                    std::vector<std::vector<float>>*) {
  return absl::UnimplementedError("this client serves no embedding tables");
}

absl::Status PsClient::PushWithRows(int64_t, absl::Span<const float>,
                                    const std::vector<std::vector<int64_t>>&,
                                    const std::vector<std::vector<float>>&) {
  return absl::UnimplementedError("this client serves no embedding tables");
}

}  // namespace paramserver
