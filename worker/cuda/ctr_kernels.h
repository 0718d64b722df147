// The CTR step's kernels (the MLP's GEMMs are cuBLAS's): building each example's input
// from its dense features and its fields' rows, the logit's loss and gradient, and the
// rows' gradients as segmented sums. Each function enqueues its kernel on `stream` and
// returns cudaGetLastError(). All pointers are device pointers; matrices are row-major.
#ifndef PARAMSERVER_WORKER_CUDA_CTR_KERNELS_H_
#define PARAMSERVER_WORKER_CUDA_CTR_KERNELS_H_

#include <cuda_runtime.h>

#include <cstdint>

namespace paramserver {
namespace cuda {

// x[b, :dense] = dense[b, :]; x[b, dense + k*dim + e] = rows[(row_base[k] + row_of[b, k])
// * dim + e], or 0 where row_of[b, k] < 0 (a missing id: an empty bag).
cudaError_t LaunchGatherInput(const float* dense, const int32_t* row_of, const int32_t* row_base,
                              const float* rows, int examples, int dense_features, int fields,
                              int dim, float* x, cudaStream_t stream);

// The mean BCE-with-logits' parts: row_loss[b] = max(z,0) - z*y + log1p(exp(-|z|)) and
// delta[b] = (sigmoid(z) - y) / examples.
cudaError_t LaunchLogisticLoss(const float* logits, const float* labels, int examples, float* delta,
                               float* row_loss, cudaStream_t stream);

// Segmented sums: for each segment s (a field's unique id), out[s * dim + e] = the sum,
// in the order listed, of dx[example * input + column[s] + e] over the examples
// segment_examples[segment_begin[s] .. segment_begin[s + 1]). One thread per (s, e)
// adds them one after another: deterministic, and the CPU's order when the examples
// ascend.
cudaError_t LaunchSegmentSums(const float* dx, int input, const int32_t* segment_begin,
                              const int32_t* segment_examples, const int32_t* column, int segments,
                              int dim, float* out, cudaStream_t stream);

}  // namespace cuda
}  // namespace paramserver

#endif  // PARAMSERVER_WORKER_CUDA_CTR_KERNELS_H_
