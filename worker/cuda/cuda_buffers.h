// Owning wrappers for device memory and pinned host memory. Not thread-safe.
#ifndef PARAMSERVER_WORKER_CUDA_CUDA_BUFFERS_H_
#define PARAMSERVER_WORKER_CUDA_CUDA_BUFFERS_H_

#include <cuda_runtime_api.h>

#include <cstddef>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "worker/cuda/cuda_status.h"

namespace paramserver {
namespace cuda {

// `count` elements of T in device memory (kDevice) or page-locked host memory (kPinned).
// Reserve grows the buffer, dropping its contents; it never shrinks.
enum class MemoryKind { kDevice, kPinned };

template <typename T, MemoryKind kKind>
class CudaBuffer {
 public:
  CudaBuffer() = default;
  CudaBuffer(const CudaBuffer&) = delete;
  CudaBuffer& operator=(const CudaBuffer&) = delete;
  ~CudaBuffer() { Release(); }

  // Makes room for at least `count` elements. `what` names the buffer in errors.
  absl::Status Reserve(size_t count, const char* what) {
    if (count <= capacity_) return absl::OkStatus();
    Release();
    void* memory = nullptr;
    const cudaError_t result = kKind == MemoryKind::kDevice
                                   ? cudaMalloc(&memory, count * sizeof(T))
                                   : cudaMallocHost(&memory, count * sizeof(T));
    if (result != cudaSuccess) {
      return CudaCallStatus(
          result, absl::StrCat(kKind == MemoryKind::kDevice ? "cudaMalloc" : "cudaMallocHost", "(",
                               what, ", ", count * sizeof(T), " bytes)"));
    }
    data_ = static_cast<T*>(memory);
    capacity_ = count;
    return absl::OkStatus();
  }

  T* data() const { return data_; }

 private:
  void Release() {
    if (data_ == nullptr) return;
    if (kKind == MemoryKind::kDevice) {
      cudaFree(data_);
    } else {
      cudaFreeHost(data_);
    }
    data_ = nullptr;
    capacity_ = 0;
  }

  T* data_ = nullptr;
  size_t capacity_ = 0;
};

template <typename T>
using DeviceBuffer = CudaBuffer<T, MemoryKind::kDevice>;
template <typename T>
using PinnedBuffer = CudaBuffer<T, MemoryKind::kPinned>;

}  // namespace cuda
}  // namespace paramserver

#endif  // PARAMSERVER_WORKER_CUDA_CUDA_BUFFERS_H_
