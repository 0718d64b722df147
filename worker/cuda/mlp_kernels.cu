#include <cfloat>

#include "worker/cuda/mlp_kernels.h"

namespace paramserver {
namespace cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarp = 32;

int BlocksFor(int64_t count) {
  const int64_t blocks = (count + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 65535 ? (blocks > 0 ? blocks : 1) : 65535);
}

__global__ void BiasActivationKernel(float* z, const float* bias, int rows, int cols, bool relu) {
  const int64_t count = static_cast<int64_t>(rows) * cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float value = z[i] + bias[i % cols];
    z[i] = relu ? fmaxf(value, 0.0f) : value;
  }
}

__global__ void ReluBackwardKernel(float* delta, const float* activation, int64_t count) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (activation[i] <= 0.0f) delta[i] = 0.0f;
  }
}

__device__ float WarpMax(float value) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    value = fmaxf(value, __shfl_xor_sync(0xffffffff, value, offset));
  return value;
}

__device__ float WarpSum(float value) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    value += __shfl_xor_sync(0xffffffff, value, offset);
  return value;
}

// One warp per row; each lane takes classes lane, lane + 32, ...
__global__ void SoftmaxCrossEntropyKernel(const float* logits, const uint8_t* labels, int rows,
                                          int classes, float inv_rows, float* delta,
                                          float* row_loss) {
  const int row = blockIdx.x * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  const int lane = threadIdx.x % kWarp;
  if (row >= rows) return;  // whole warps leave together: rows are warp-uniform
  const float* z = logits + static_cast<int64_t>(row) * classes;
  float* d = delta + static_cast<int64_t>(row) * classes;
  float max_logit = -FLT_MAX;
  for (int j = lane; j < classes; j += kWarp) max_logit = fmaxf(max_logit, z[j]);
  max_logit = WarpMax(max_logit);
  float sum = 0.0f;
  for (int j = lane; j < classes; j += kWarp) sum += expf(z[j] - max_logit);
  sum = WarpSum(sum);
  const int label = labels[row];
  const float inv_sum = 1.0f / sum;
  for (int j = lane; j < classes; j += kWarp) {
    const float probability = expf(z[j] - max_logit) * inv_sum;
    d[j] = (probability - (j == label ? 1.0f : 0.0f)) * inv_rows;
  }
  if (lane == 0) row_loss[row] = logf(sum) + max_logit - z[label];
}

__global__ void ColumnSumsKernel(const float* matrix, int rows, int cols, float* out) {
  for (int col = blockIdx.x * blockDim.x + threadIdx.x; col < cols; col += gridDim.x * blockDim.x) {
    float sum = 0.0f;
    for (int r = 0; r < rows; ++r) sum += matrix[static_cast<int64_t>(r) * cols + col];
    out[col] = sum;
  }
}

// A single block: each thread sums a strided slice, then a tree in shared memory.
__global__ void SumKernel(const float* values, int count, float* out) {
  __shared__ float partial[kThreads];
  float sum = 0.0f;
  for (int i = threadIdx.x; i < count; i += blockDim.x) sum += values[i];
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) *out = partial[0];
}

__global__ void CountCorrectKernel(const float* logits, const uint8_t* labels, int rows,
                                   int classes, int* correct) {
  const int row = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= rows) return;
  const float* z = logits + static_cast<int64_t>(row) * classes;
  int best = 0;
  for (int j = 1; j < classes; ++j) {
    if (z[j] > z[best]) best = j;
  }
  if (best == labels[row]) atomicAdd(correct, 1);
}

}  // namespace

cudaError_t LaunchBiasActivation(float* z, const float* bias, int rows, int cols, bool relu,
                                 cudaStream_t stream) {
  BiasActivationKernel<<<BlocksFor(static_cast<int64_t>(rows) * cols), kThreads, 0, stream>>>(
      z, bias, rows, cols, relu);
  return cudaGetLastError();
}

cudaError_t LaunchReluBackward(float* delta, const float* activation, int64_t count,
                               cudaStream_t stream) {
  ReluBackwardKernel<<<BlocksFor(count), kThreads, 0, stream>>>(delta, activation, count);
  return cudaGetLastError();
}

cudaError_t LaunchSoftmaxCrossEntropy(const float* logits, const uint8_t* labels, int rows,
                                      int classes, float* delta, float* row_loss,
                                      cudaStream_t stream) {
  const int rows_per_block = kThreads / kWarp;
  const int blocks = (rows + rows_per_block - 1) / rows_per_block;
  SoftmaxCrossEntropyKernel<<<blocks, kThreads, 0, stream>>>(logits, labels, rows, classes,
                                                             1.0f / rows, delta, row_loss);
  return cudaGetLastError();
}

cudaError_t LaunchColumnSums(const float* matrix, int rows, int cols, float* out,
                             cudaStream_t stream) {
  ColumnSumsKernel<<<BlocksFor(cols), kThreads, 0, stream>>>(matrix, rows, cols, out);
  return cudaGetLastError();
}

cudaError_t LaunchSum(const float* values, int count, float* out, cudaStream_t stream) {
  SumKernel<<<1, kThreads, 0, stream>>>(values, count, out);
  return cudaGetLastError();
}

cudaError_t LaunchCountCorrect(const float* logits, const uint8_t* labels, int rows, int classes,
                               int* correct, cudaStream_t stream) {
  cudaError_t cleared = cudaMemsetAsync(correct, 0, sizeof(int), stream);
  if (cleared != cudaSuccess) return cleared;
  CountCorrectKernel<<<BlocksFor(rows), kThreads, 0, stream>>>(logits, labels, rows, classes,
                                                               correct);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace paramserver
