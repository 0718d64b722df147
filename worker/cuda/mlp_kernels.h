// The MLP's element-wise and reduction kernels (the GEMMs are cuBLAS's). Each function
// enqueues its kernel on `stream` and returns cudaGetLastError(): launch errors only;
// execution errors surface at the next synchronising call. All pointers are device
// pointers; matrices are row-major.
#ifndef PARAMSERVER_WORKER_CUDA_MLP_KERNELS_H_
#define PARAMSERVER_WORKER_CUDA_MLP_KERNELS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

namespace paramserver {
namespace cuda {

// z[r, j] += bias[j]; then z = max(z, 0) when `relu`.
cudaError_t LaunchBiasActivation(float* z, const float* bias, int rows, int cols, bool relu,
                                 cudaStream_t stream);

// delta[i] = 0 wherever activation[i] <= 0 (ReLU's derivative, from its output).
cudaError_t LaunchReluBackward(float* delta, const float* activation, int64_t count,
                               cudaStream_t stream);

// Softmax cross-entropy of each row of logits [rows, classes] against labels:
// row_loss[r] = logsumexp(z_r) - z_r[label_r];
// delta[r, j] = (softmax(z_r)[j] - [j == label_r]) / rows.
cudaError_t LaunchSoftmaxCrossEntropy(const float* logits, const uint8_t* labels, int rows,
                                      int classes, float* delta, float* row_loss,
                                      cudaStream_t stream);

// out[j] = sum over r of matrix[r, j], in row order (deterministic).
cudaError_t LaunchColumnSums(const float* matrix, int rows, int cols, float* out,
                             cudaStream_t stream);

// *out = sum of values[0..count), in a fixed order (deterministic).
cudaError_t LaunchSum(const float* values, int count, float* out, cudaStream_t stream);

// *correct = number of rows whose first largest logit is at the row's label.
cudaError_t LaunchCountCorrect(const float* logits, const uint8_t* labels, int rows, int classes,
                               int* correct, cudaStream_t stream);

}  // namespace cuda
}  // namespace paramserver

#endif  // PARAMSERVER_WORKER_CUDA_MLP_KERNELS_H_
