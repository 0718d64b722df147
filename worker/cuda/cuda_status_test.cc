#include "worker/cuda/cuda_status.h"

#include "catch2/catch.hpp"

namespace paramserver {
namespace cuda {
namespace {

TEST_CASE("CUDA runtime errors become statuses naming the call and the error") {
  CHECK(CudaCallStatus(cudaSuccess, "cudaMalloc").ok());
  absl::Status oom =
      CudaCallStatus(cudaErrorMemoryAllocation, "cudaMalloc(parameters, 4096 bytes)");
  CHECK(oom.code() == absl::StatusCode::kResourceExhausted);
  CHECK(std::string(oom.message()).find("cudaMalloc(parameters, 4096 bytes): ") == 0);
  CHECK(std::string(oom.message()).find("(cudaErrorMemoryAllocation)") != std::string::npos);
  CHECK(CudaCallStatus(cudaErrorNoDevice, "cudaGetDeviceCount").code() ==
        absl::StatusCode::kUnavailable);
  CHECK(CudaCallStatus(cudaErrorInsufficientDriver, "cudaGetDeviceCount").code() ==
        absl::StatusCode::kUnavailable);
  CHECK(CudaCallStatus(cudaErrorInvalidValue, "cudaMemcpyAsync").code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(CudaCallStatus(cudaErrorLaunchFailure, "kernel").code() == absl::StatusCode::kInternal);
}

TEST_CASE("a machine without a GPU is told so, not told to upgrade its driver") {
  // No driver loaded: what the runtime reports on a machine with no GPU at all.
  absl::Status none = ExplainNoGpu(cudaErrorInsufficientDriver, "");
  CHECK(none.code() == absl::StatusCode::kUnavailable);
  CHECK(
      std::string(none.message()).rfind("no GPU on this machine (no NVIDIA driver is loaded", 0) ==
      0);
  CHECK(std::string(none.message()).find("insufficient") == std::string::npos);
  // A driver that sees no device.
  const std::string version =
      "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n"
      "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n";
  CHECK(std::string(ExplainNoGpu(cudaErrorNoDevice, version).message())
            .rfind("no GPU on this machine (the NVIDIA driver is loaded but sees no device", 0) ==
        0);
  // A loaded driver too old for this runtime: that one is about the driver.
  absl::Status old = ExplainNoGpu(cudaErrorInsufficientDriver, version);
  CHECK(std::string(old.message()).find("too old") != std::string::npos);
  CHECK(std::string(old.message()).find("needs driver 580 or newer") != std::string::npos);
  CHECK(std::string(old.message()).find("535.104.05") != std::string::npos);
  CHECK(std::string(old.message()).find("GCC") == std::string::npos);
}

TEST_CASE("cuBLAS errors become statuses naming the call and the error") {
  CHECK(CublasCallStatus(CUBLAS_STATUS_SUCCESS, "cublasSgemm").ok());
  absl::Status failed =
      CublasCallStatus(CUBLAS_STATUS_EXECUTION_FAILED, "cublasSgemm(forward, layer 1)");
  CHECK(failed.code() == absl::StatusCode::kInternal);
  CHECK(std::string(failed.message()).find("cublasSgemm(forward, layer 1): ") == 0);
  CHECK(std::string(failed.message()).find("CUBLAS_STATUS_EXECUTION_FAILED") != std::string::npos);
  CHECK(CublasCallStatus(CUBLAS_STATUS_ALLOC_FAILED, "cublasCreate").code() ==
        absl::StatusCode::kResourceExhausted);
  CHECK(CublasCallStatus(CUBLAS_STATUS_NOT_INITIALIZED, "cublasCreate").code() ==
        absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace cuda
}  // namespace paramserver
