// The GEMM wrapper on a GPU: cuBLAS, f32 accumulation, no TF32. The
// arguments go to cuBLAS unchanged after the shared checks (gemm_args.cc).
#include <cublas_v2.h>

#include "kernels/cuda/gemm.h"

namespace switchserve::cuda {

struct GemmHandle {
  cublasHandle_t cublas = nullptr;
};

namespace {

cublasComputeType_t ComputeType(GemmCompute compute) {
  return compute == GemmCompute::kFloat32Pedantic ? CUBLAS_COMPUTE_32F_PEDANTIC
                                                  : CUBLAS_COMPUTE_32F;
}

}  // namespace

cublasStatus_t CreateGemmHandle(cudaStream_t stream, GemmHandle** handle) {
  *handle = nullptr;
  cublasHandle_t cublas = nullptr;
  if (cublasStatus_t s = cublasCreate(&cublas); s != CUBLAS_STATUS_SUCCESS) return s;
  // Default math: COMPUTE_32F stays f32 (TF32 only with CUBLAS_TF32_TENSOR_OP_MATH).
  cublasStatus_t s = cublasSetMathMode(cublas, CUBLAS_DEFAULT_MATH);
  if (s == CUBLAS_STATUS_SUCCESS) s = cublasSetPointerMode(cublas, CUBLAS_POINTER_MODE_HOST);
  if (s == CUBLAS_STATUS_SUCCESS) s = cublasSetStream(cublas, stream);
  if (s != CUBLAS_STATUS_SUCCESS) {
    cublasDestroy(cublas);
    return s;
  }
  *handle = new GemmHandle{cublas};
  return CUBLAS_STATUS_SUCCESS;
}

void DestroyGemmHandle(GemmHandle* handle) {
  if (handle == nullptr) return;
  cublasDestroy(handle->cublas);
  delete handle;
}

cublasStatus_t SetGemmStream(GemmHandle* handle, cudaStream_t stream) {
  return cublasSetStream(handle->cublas, stream);
}

cublasStatus_t Gemm(GemmHandle* handle, cublasOperation_t transa, cublasOperation_t transb, int m,
                    int n, int k, float alpha, const void* a, cudaDataType_t a_type, int lda,
                    const void* b, cudaDataType_t b_type, int ldb, float beta, void* c,
                    cudaDataType_t c_type, int ldc, GemmCompute compute) {
  if (!CheckGemmArguments(transa, transb, m, n, k, a_type, lda, b_type, ldb, c_type, ldc, false)
           .empty()) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  return cublasGemmEx(handle->cublas, transa, transb, m, n, k, &alpha, a, a_type, lda, b, b_type,
                      ldb, &beta, c, c_type, ldc, ComputeType(compute), CUBLAS_GEMM_DEFAULT);
}

cublasStatus_t GemmStridedBatched(GemmHandle* handle, cublasOperation_t transa,
                                  cublasOperation_t transb, int m, int n, int k, float alpha,
                                  const void* a, cudaDataType_t a_type, int lda, long long stride_a,
                                  const void* b, cudaDataType_t b_type, int ldb, long long stride_b,
                                  float beta, void* c, cudaDataType_t c_type, int ldc,
                                  long long stride_c, int batch_count, GemmCompute compute) {
  if (batch_count < 0 || stride_a < 0 || stride_b < 0 || stride_c < 0 ||
      !CheckGemmArguments(transa, transb, m, n, k, a_type, lda, b_type, ldb, c_type, ldc, false)
           .empty()) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  return cublasGemmStridedBatchedEx(handle->cublas, transa, transb, m, n, k, &alpha, a, a_type, lda,
                                    stride_a, b, b_type, ldb, stride_b, &beta, c, c_type, ldc,
                                    stride_c, batch_count, ComputeType(compute),
                                    CUBLAS_GEMM_DEFAULT);
}

cublasStatus_t GemmGroupedBatched(GemmHandle* handle, const cublasOperation_t transa[],
                                  const cublasOperation_t transb[], const int m[], const int n[],
                                  const int k[], const float alpha[], const void* const a[],
                                  cudaDataType_t a_type, const int lda[], const void* const b[],
                                  cudaDataType_t b_type, const int ldb[], const float beta[],
                                  void* const c[], cudaDataType_t c_type, const int ldc[],
                                  int group_count, const int group_size[]) {
  if (group_count < 0) return CUBLAS_STATUS_INVALID_VALUE;
  for (int g = 0; g < group_count; ++g) {
    if (group_size[g] < 0 || !CheckGemmArguments(transa[g], transb[g], m[g], n[g], k[g], a_type,
                                                 lda[g], b_type, ldb[g], c_type, ldc[g], true)
                                  .empty()) {
      return CUBLAS_STATUS_INVALID_VALUE;
    }
  }
  return cublasGemmGroupedBatchedEx(handle->cublas, transa, transb, m, n, k, alpha, a, a_type, lda,
                                    b, b_type, ldb, beta, c, c_type, ldc, group_count, group_size,
                                    CUBLAS_COMPUTE_32F);
}

}  // namespace switchserve::cuda
