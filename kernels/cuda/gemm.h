// The one wrapper for every dense matrix product of the CUDA backend, with
// cuBLAS's own conventions and argument order: column-major storage,
// C (m x n) = alpha * op(A) (m x k) * op(B) (k x n) + beta * C, leading
// dimensions and batch strides in elements, scalars on the host.
//
//   GPU build        cublasGemmEx / cublasGemmStridedBatchedEx /
//                    cublasGemmGroupedBatchedEx with CUBLAS_COMPUTE_32F (or
//                    _PEDANTIC for routers); default math mode, so no TF32.
//   emulated build   OpenBLAS cblas_sgemm with exactly these arguments, bf16 and
//                    f16 operands widened to f32 in their own layout, the result
//                    rounded to C's type (nearest even); queued on the stream
//                    like a kernel. Every pointer must be device memory and every
//                    matrix must fit inside its allocation, so a wrong transpose,
//                    leading dimension or stride fails a test instead of reading
//                    a neighbour's data.
//
// Types: A and B f32, bf16 or f16 (the same); C f32 or A's type; f32
// accumulation. The grouped product needs C of A's type (cuBLAS 13's table).
// Arguments cuBLAS rejects are rejected the same way by both builds
// (CUBLAS_STATUS_INVALID_VALUE / NOT_SUPPORTED; the emulated build also
// reports the reason through the executor's error handling).
//
// A handle is bound to one stream and is not thread-safe.
#ifndef SWITCHSERVE_KERNELS_CUDA_GEMM_H_
#define SWITCHSERVE_KERNELS_CUDA_GEMM_H_

#include <cublas_api.h>
#include <cuda_runtime_api.h>

#include <string>

namespace switchserve::cuda {

enum class GemmCompute {
  kFloat32,          // CUBLAS_COMPUTE_32F
  kFloat32Pedantic,  // CUBLAS_COMPUTE_32F_PEDANTIC: routers, where near ties decide experts
};

struct GemmHandle;

// Creates a handle whose products run on `stream`. On a machine without a
// usable GPU the GPU build returns CUBLAS_STATUS_NOT_INITIALIZED.
cublasStatus_t CreateGemmHandle(cudaStream_t stream, GemmHandle** handle);
void DestroyGemmHandle(GemmHandle* handle);
cublasStatus_t SetGemmStream(GemmHandle* handle, cudaStream_t stream);

cublasStatus_t Gemm(GemmHandle* handle, cublasOperation_t transa, cublasOperation_t transb, int m,
                    int n, int k, float alpha, const void* a, cudaDataType_t a_type, int lda,
                    const void* b, cudaDataType_t b_type, int ldb, float beta, void* c,
                    cudaDataType_t c_type, int ldc, GemmCompute compute = GemmCompute::kFloat32);

// `batch_count` products; matrix i of A starts at a + i * stride_a elements
// (a stride of 0 reuses one matrix), likewise B and C.
cublasStatus_t GemmStridedBatched(GemmHandle* handle, cublasOperation_t transa,
                                  cublasOperation_t transb, int m, int n, int k, float alpha,
                                  const void* a, cudaDataType_t a_type, int lda, long long stride_a,
                                  const void* b, cudaDataType_t b_type, int ldb, long long stride_b,
                                  float beta, void* c, cudaDataType_t c_type, int ldc,
                                  long long stride_c, int batch_count,
                                  GemmCompute compute = GemmCompute::kFloat32);

// `group_count` groups; group g has group_size[g] products that share
// transa[g], transb[g], m[g], n[g], k[g], alpha[g], lda[g], ldb[g], beta[g],
// ldc[g]. The per-group arrays are host memory, read during the call; a, b
// and c are device arrays of device pointers, one per product (groups in
// order), read when the product runs (a kernel queued before may write them).
cublasStatus_t GemmGroupedBatched(GemmHandle* handle, const cublasOperation_t transa[],
                                  const cublasOperation_t transb[], const int m[], const int n[],
                                  const int k[], const float alpha[], const void* const a[],
                                  cudaDataType_t a_type, const int lda[], const void* const b[],
                                  cudaDataType_t b_type, const int ldb[], const float beta[],
                                  void* const c[], cudaDataType_t c_type, const int ldc[],
                                  int group_count, const int group_size[]);

// Shared by both builds (gemm_args.cc): "" when cuBLAS accepts these
// arguments for one product, else why not.
std::string CheckGemmArguments(cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                               int k, cudaDataType_t a_type, int lda, cudaDataType_t b_type,
                               int ldb, cudaDataType_t c_type, int ldc, bool grouped);
// Elements spanned by a column-major rows x cols matrix with leading
// dimension ld (0 when it is empty).
long long MatrixSpan(int rows, int cols, int ld);
// Bytes of one element of a GEMM type (4, 2, or 0 when not a GEMM type).
int GemmTypeBytes(cudaDataType_t type);

}  // namespace switchserve::cuda

#endif  // SWITCHSERVE_KERNELS_CUDA_GEMM_H_
