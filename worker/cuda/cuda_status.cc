#include "worker/cuda/cuda_status.h"

#include "absl/strings/str_cat.h"

namespace paramserver {
namespace cuda {

absl::Status CudaCallStatus(cudaError_t result, absl::string_view call) {
  if (result == cudaSuccess) return absl::OkStatus();
  const std::string message =
      absl::StrCat(call, ": ", cudaGetErrorString(result), " (", cudaGetErrorName(result), ")");
  switch (result) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorInvalidDevice:
    case cudaErrorDevicesUnavailable:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
      return absl::UnavailableError(message);
    case cudaErrorInvalidValue:
      return absl::InvalidArgumentError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::Status ExplainNoGpu(cudaError_t result, absl::string_view driver_version) {
  const std::string runtime_said = absl::StrCat("cudaGetDeviceCount: ", cudaGetErrorName(result));
  if (driver_version.empty() &&
      (result == cudaErrorInsufficientDriver || result == cudaErrorNoDevice)) {
    return absl::UnavailableError(absl::StrCat(
        "no GPU on this machine (no NVIDIA driver is loaded: /proc/driver/nvidia/version is "
        "absent; ",
        runtime_said, ")"));
  }
  if (result == cudaErrorNoDevice || result == cudaSuccess) {
    return absl::UnavailableError(
        absl::StrCat("no GPU on this machine (the NVIDIA driver is loaded but sees no device; ",
                     runtime_said, ")"));
  }
  if (result == cudaErrorInsufficientDriver) {
    // "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  ..." -> its first line.
    const absl::string_view first_line = driver_version.substr(0, driver_version.find('\n'));
    return absl::UnavailableError(absl::StrCat(
        "the NVIDIA driver on this machine is too old for the CUDA ", CUDART_VERSION / 1000,
        " runtime this worker was built with (it needs driver 580 or newer; the loaded one: ",
        first_line, ")"));
  }
  return CudaCallStatus(result, "cudaGetDeviceCount");
}

absl::Status CublasCallStatus(cublasStatus_t result, absl::string_view call) {
  if (result == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  const std::string message = absl::StrCat(call, ": ", cublasGetStatusString(result), " (",
                                           cublasGetStatusName(result), ")");
  switch (result) {
    case CUBLAS_STATUS_ALLOC_FAILED:
      return absl::ResourceExhaustedError(message);
    case CUBLAS_STATUS_NOT_INITIALIZED:
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return absl::UnavailableError(message);
    case CUBLAS_STATUS_INVALID_VALUE:
      return absl::InvalidArgumentError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::Status OpenStreamAndCublas(int device, cudaStream_t* stream, cublasHandle_t* cublas) {
  absl::Status status =
      CudaCallStatus(cudaSetDevice(device), absl::StrCat("cudaSetDevice(", device, ")"));
  if (status.ok()) {
    status = CudaCallStatus(cudaStreamCreateWithFlags(stream, cudaStreamNonBlocking),
                            "cudaStreamCreate");
  }
  if (status.ok()) status = CublasCallStatus(cublasCreate(cublas), "cublasCreate");
  if (status.ok()) status = CublasCallStatus(cublasSetStream(*cublas, *stream), "cublasSetStream");
  if (status.ok()) {
    status =
        CublasCallStatus(cublasSetMathMode(*cublas, CUBLAS_PEDANTIC_MATH), "cublasSetMathMode");
  }
  return status;
}

}  // namespace cuda
}  // namespace paramserver
