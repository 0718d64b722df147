#include "worker/cuda/gpu_devices.h"

#include "catch2/catch.hpp"

namespace paramserver {
namespace cuda {
namespace {

TEST_CASE("GPU queries answer with a count or with the reason there is none") {
  absl::StatusOr<int> count = CountUsableGpus();
  if (count.ok()) {
    CHECK(BuiltWithCuda());
    CHECK(*count >= 1);
    absl::StatusOr<std::string> description = DescribeGpu(0);
    REQUIRE(description.ok());
    CHECK(description->find("sm_") != std::string::npos);
    CHECK_FALSE(DescribeGpu(*count).ok());  // one past the last device
  } else {
    // Here (no GPU, or no CUDA in the build) the reason is a sentence, not a crash.
    CHECK(!count.status().message().empty());
    CHECK((count.status().code() == absl::StatusCode::kUnavailable ||
           count.status().code() == absl::StatusCode::kFailedPrecondition));
    CHECK_FALSE(CreateCudaBackend(MlpLayout({4, 3}), 0).ok());
  }
}

}  // namespace
}  // namespace cuda
}  // namespace paramserver
