#include "worker/device_selection.h"

#include "catch2/catch.hpp"

namespace paramserver {
namespace {

// A backend that only says what it is.
class NamedFakeBackend final : public ComputeBackend {
 public:
  explicit NamedFakeBackend(std::string name) : name_(std::move(name)) {}
  std::string name() const override { return name_; }
  absl::StatusOr<float> ComputeGradients(absl::Span<const float>, const BatchView&,
                                         absl::Span<float>) override {
    return absl::UnimplementedError("fake");
  }
  absl::StatusOr<int64_t> CountCorrect(absl::Span<const float>, const BatchView&) override {
    return absl::UnimplementedError("fake");
  }

 private:
  std::string name_;
};

GpuProvider FakeGpus(absl::StatusOr<int> count, bool creation_fails = false) {
  return {
      [count] { return count; },
      [](int i) -> absl::StatusOr<std::string> { return "Fake GPU " + std::to_string(i); },
      [creation_fails](const MlpLayout&, int i) -> absl::StatusOr<std::unique_ptr<ComputeBackend>> {
        if (creation_fails) return absl::ResourceExhaustedError("cudaMalloc: out of memory");
        return std::unique_ptr<ComputeBackend>(new NamedFakeBackend("cuda:" + std::to_string(i)));
      }};
}

const MlpLayout kLayout({4, 3});

std::string Pick(const std::string& device, const GpuProvider& gpus) {
  absl::StatusOr<std::unique_ptr<ComputeBackend>> backend =
      CreateComputeBackend(device, kLayout, gpus);
  REQUIRE(backend.ok());
  return (*backend)->name();
}

TEST_CASE("auto takes GPU 0 when there is one and the CPU otherwise") {
  CHECK(Pick("auto", FakeGpus(2)) == "cuda:0");
  CHECK(Pick("auto", FakeGpus(absl::UnavailableError("no driver"))) == "cpu");
  CHECK(Pick("auto", FakeGpus(1, /*creation_fails=*/true)) == "cpu");
}

TEST_CASE("cpu never touches the GPU; gpu and gpu:N take that GPU") {
  CHECK(Pick("cpu", FakeGpus(2)) == "cpu");
  CHECK(Pick("gpu", FakeGpus(2)) == "cuda:0");
  CHECK(Pick("gpu:1", FakeGpus(2)) == "cuda:1");
}

TEST_CASE("asking for a GPU that is not there is a clear error, not a fallback") {
  absl::StatusOr<std::unique_ptr<ComputeBackend>> none = CreateComputeBackend(
      "gpu", kLayout, FakeGpus(absl::UnavailableError("cudaGetDeviceCount: no CUDA device")));
  REQUIRE_FALSE(none.ok());
  CHECK(none.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK(
      std::string(none.status().message()) ==
      "device gpu asks for a GPU, but there is no usable GPU: cudaGetDeviceCount: no CUDA device");
  absl::StatusOr<std::unique_ptr<ComputeBackend>> past =
      CreateComputeBackend("gpu:2", kLayout, FakeGpus(2));
  REQUIRE_FALSE(past.ok());
  CHECK(std::string(past.status().message())
            .find("asks for GPU 2, but this machine has 2 usable GPU(s)") != std::string::npos);
  CHECK(CreateComputeBackend("gpu", kLayout, FakeGpus(1, true)).status().code() ==
        absl::StatusCode::kResourceExhausted);
  CHECK(CreateComputeBackend("tpu", kLayout, FakeGpus(1)).status().code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("on this machine's real GPUs, auto always yields a working backend") {
  absl::StatusOr<std::unique_ptr<ComputeBackend>> backend =
      CreateComputeBackend("auto", kLayout, SystemGpus());
  REQUIRE(backend.ok());
  std::vector<float> params(kLayout.total_parameters(), 0.1f), gradient(params.size());
  std::vector<float> features = {1, 0, 0, 1};
  std::vector<uint8_t> labels = {2};
  absl::StatusOr<float> loss = (*backend)->ComputeGradients(
      params, {features.data(), labels.data(), 1}, absl::MakeSpan(gradient));
  REQUIRE(loss.ok());
  CHECK(*loss == Approx(std::log(3.0)));  // equal logits: uniform softmax over 3 classes
}

}  // namespace
}  // namespace paramserver
