// Row-major matrix products with cuBLAS, which is column-major: a row-major M [r, c] is
// the column-major M^T [c, r], so each product is issued as its transpose. Shared by the
// MLP backend and the CTR step.
#ifndef PARAMSERVER_WORKER_CUDA_ROW_MAJOR_GEMM_H_
#define PARAMSERVER_WORKER_CUDA_ROW_MAJOR_GEMM_H_

#include <cublas_v2.h>

namespace paramserver {
namespace cuda {

//   out[rows, n] = in[rows, k] * W[n, k]^T    ->  out^T = W * in^T
inline cublasStatus_t RowMajorTimesTransposed(cublasHandle_t handle, int rows, int n, int k,
                                              const float* in, const float* weight, float* out) {
  const float one = 1.0f, zero = 0.0f;
  return cublasSgemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, n, rows, k, &one, weight, k, in, k, &zero,
                     out, n);
}

//   weight_grad[n, k] = delta[rows, n]^T * in[rows, k]  ->  weight_grad^T = in^T * delta
inline cublasStatus_t WeightGradient(cublasHandle_t handle, int rows, int n, int k,
                                     const float* delta, const float* in, float* weight_grad) {
  const float one = 1.0f, zero = 0.0f;
  return cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_T, k, n, rows, &one, in, k, delta, n, &zero,
                     weight_grad, k);
}

//   in_grad[rows, k] = delta[rows, n] * W[n, k]  ->  in_grad^T = W^T * delta^T
inline cublasStatus_t InputGradient(cublasHandle_t handle, int rows, int n, int k,
                                    const float* delta, const float* weight, float* in_grad) {
  const float one = 1.0f, zero = 0.0f;
  return cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, k, rows, n, &one, weight, k, delta, n, &zero,
                     in_grad, k);
}

}  // namespace cuda
}  // namespace paramserver

#endif  // PARAMSERVER_WORKER_CUDA_ROW_MAJOR_GEMM_H_
