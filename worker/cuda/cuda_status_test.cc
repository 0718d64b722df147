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
