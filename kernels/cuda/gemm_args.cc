// Argument rules of the GEMM wrapper, shared by the cuBLAS and the emulated
// builds so that both reject the same calls.
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/gemm.h"

namespace switchserve::cuda {
namespace {

const char* TypeName(cudaDataType_t type) {
  switch (type) {
    case CUDA_R_32F:
      return "CUDA_R_32F";
    case CUDA_R_16BF:
      return "CUDA_R_16BF";
    case CUDA_R_16F:
      return "CUDA_R_16F";
    default:
      return "an unsupported cudaDataType_t";
  }
}

bool ValidOp(cublasOperation_t op) { return op == CUBLAS_OP_N || op == CUBLAS_OP_T; }

}  // namespace

int GemmTypeBytes(cudaDataType_t type) {
  switch (type) {
    case CUDA_R_32F:
      return 4;
    case CUDA_R_16BF:
    case CUDA_R_16F:
      return 2;
    default:
      return 0;
  }
}

long long MatrixSpan(int rows, int cols, int ld) {
  if (rows <= 0 || cols <= 0) return 0;
  return static_cast<long long>(cols - 1) * ld + rows;
}

std::string CheckGemmArguments(cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                               int k, cudaDataType_t a_type, int lda, cudaDataType_t b_type,
                               int ldb, cudaDataType_t c_type, int ldc, bool grouped) {
  if (!ValidOp(transa) || !ValidOp(transb)) return "transa/transb must be CUBLAS_OP_N or _T";
  if (m < 0 || n < 0 || k < 0) {
    return absl::StrCat("negative size m=", m, " n=", n, " k=", k);
  }
  if (GemmTypeBytes(a_type) == 0 || a_type != b_type) {
    return absl::StrCat("A and B must both be CUDA_R_32F, CUDA_R_16BF or CUDA_R_16F; got ",
                        TypeName(a_type), " and ", TypeName(b_type));
  }
  if (c_type != CUDA_R_32F && c_type != a_type) {
    return absl::StrCat("C must be CUDA_R_32F or A's type; got ", TypeName(c_type));
  }
  if (grouped && c_type != a_type) {
    return absl::StrCat("the grouped product needs C of A's type; got ", TypeName(c_type), " with ",
                        TypeName(a_type));
  }
  const int a_rows = transa == CUBLAS_OP_N ? m : k;
  const int b_rows = transb == CUBLAS_OP_N ? k : n;
  const auto at_least = [](int rows) { return rows > 1 ? rows : 1; };
  if (lda < at_least(a_rows)) {
    return absl::StrCat("lda=", lda, " < ", at_least(a_rows), " (rows of A as stored)");
  }
  if (ldb < at_least(b_rows)) {
    return absl::StrCat("ldb=", ldb, " < ", at_least(b_rows), " (rows of B as stored)");
  }
  if (ldc < at_least(m)) {
    return absl::StrCat("ldc=", ldc, " < ", at_least(m), " (rows of C)");
  }
  return "";
}

}  // namespace switchserve::cuda
