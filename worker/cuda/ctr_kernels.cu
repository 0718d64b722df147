#include <cmath>

#include "worker/cuda/ctr_kernels.h"

namespace paramserver {
namespace cuda {
namespace {

constexpr int kThreads = 256;

int Blocks(int64_t count) { return static_cast<int>((count + kThreads - 1) / kThreads); }

__global__ void GatherInput(const float* dense, const int32_t* row_of, const int32_t* row_base,
                            const float* rows, int examples, int dense_features, int fields,
                            int dim, float* x) {
  const int input = dense_features + fields * dim;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<int64_t>(examples) * input) return;
  const int64_t b = i / input;
  const int c = static_cast<int>(i % input);
  if (c < dense_features) {
    x[i] = dense[b * dense_features + c];
    return;
  }
  const int k = (c - dense_features) / dim;
  const int e = (c - dense_features) % dim;
  const int32_t at = row_of[b * fields + k];
  x[i] = at < 0 ? 0.0f : rows[(static_cast<int64_t>(row_base[k]) + at) * dim + e];
}

__global__ void LogisticLoss(const float* logits, const float* labels, int examples, float* delta,
                             float* row_loss) {
  const int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= examples) return;
  const float z = logits[b];
  const float y = labels[b];
  row_loss[b] = fmaxf(z, 0.0f) - z * y + log1pf(expf(-fabsf(z)));
  const float probability = 1.0f / (1.0f + expf(-z));
  delta[b] = (probability - y) / static_cast<float>(examples);
}

__global__ void SegmentSums(const float* dx, int input, const int32_t* segment_begin,
                            const int32_t* segment_examples, const int32_t* column, int segments,
                            int dim, float* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= static_cast<int64_t>(segments) * dim) return;
  const int s = static_cast<int>(i / dim);
  const int e = static_cast<int>(i % dim);
  float sum = 0.0f;
  for (int32_t j = segment_begin[s]; j < segment_begin[s + 1]; ++j) {
    sum += dx[static_cast<int64_t>(segment_examples[j]) * input + column[s] + e];
  }
  out[i] = sum;
}

}  // namespace

cudaError_t LaunchGatherInput(const float* dense, const int32_t* row_of, const int32_t* row_base,
                              const float* rows, int examples, int dense_features, int fields,
                              int dim, float* x, cudaStream_t stream) {
  const int64_t count = static_cast<int64_t>(examples) * (dense_features + fields * dim);
  if (count == 0) return cudaSuccess;
  GatherInput<<<Blocks(count), kThreads, 0, stream>>>(dense, row_of, row_base, rows, examples,
                                                      dense_features, fields, dim, x);
  return cudaGetLastError();
}

cudaError_t LaunchLogisticLoss(const float* logits, const float* labels, int examples, float* delta,
                               float* row_loss, cudaStream_t stream) {
  if (examples == 0) return cudaSuccess;
  LogisticLoss<<<Blocks(examples), kThreads, 0, stream>>>(logits, labels, examples, delta,
                                                          row_loss);
  return cudaGetLastError();
}

cudaError_t LaunchSegmentSums(const float* dx, int input, const int32_t* segment_begin,
                              const int32_t* segment_examples, const int32_t* column, int segments,
                              int dim, float* out, cudaStream_t stream) {
  const int64_t count = static_cast<int64_t>(segments) * dim;
  if (count == 0) return cudaSuccess;
  SegmentSums<<<Blocks(count), kThreads, 0, stream>>>(dx, input, segment_begin, segment_examples,
                                                      column, segments, dim, out);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace paramserver
