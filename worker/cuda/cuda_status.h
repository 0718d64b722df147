// Turning CUDA runtime and cuBLAS results into absl::Status, naming the failed call.
#ifndef PARAMSERVER_WORKER_CUDA_CUDA_STATUS_H_
#define PARAMSERVER_WORKER_CUDA_CUDA_STATUS_H_

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace paramserver {
namespace cuda {

// OK for cudaSuccess; otherwise "<call>: <description> (<cudaErrorName>)" with a code:
// RESOURCE_EXHAUSTED for allocation failures, UNAVAILABLE when no usable device or
// driver is present, INVALID_ARGUMENT for bad arguments, INTERNAL otherwise.
absl::Status CudaCallStatus(cudaError_t result, absl::string_view call);

// Why cudaGetDeviceCount found no GPU, in words that say what is true of this machine.
// `driver_version` is the text of /proc/driver/nvidia/version ("" when the file is
// absent: no NVIDIA kernel driver is loaded). The CUDA runtime reports a machine with no
// driver at all as cudaErrorInsufficientDriver ("CUDA driver version is insufficient"),
// which reads like "upgrade your driver"; this says "no GPU on this machine" instead, and
// keeps "the driver is too old" for a loaded driver the runtime refuses. UNAVAILABLE.
absl::Status ExplainNoGpu(cudaError_t result, absl::string_view driver_version);

// The same for cuBLAS: "<call>: <description> (<CUBLAS_STATUS_...>)".
absl::Status CublasCallStatus(cublasStatus_t result, absl::string_view call);

// Makes GPU `device` current and opens a non-blocking stream and a cuBLAS handle on it,
// in plain FP32 math (no TF32: results match the CPU's and PyTorch's defaults). The
// caller destroys them (even after an error: whichever were made are set).
absl::Status OpenStreamAndCublas(int device, cudaStream_t* stream, cublasHandle_t* cublas);

}  // namespace cuda
}  // namespace paramserver

#endif  // PARAMSERVER_WORKER_CUDA_CUDA_STATUS_H_
