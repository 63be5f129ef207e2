// The GEMM wrapper on the SIMT executor: OpenBLAS cblas_sgemm with the
// caller's cuBLAS arguments (column-major, transposes, leading dimensions),
// queued on the handle's stream like a kernel. bf16/f16 operands are widened
// to f32 in their own layout; a bf16/f16 C is widened, updated in f32 and
// rounded back (nearest even), as cuBLAS does with f32 compute.
#include <cblas.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/simt_internal.h"

namespace switchserve::cuda {

struct GemmHandle {
  cudaStream_t stream = nullptr;
};

namespace {

using simt::detail::Report;

// One product with its pointers; the arguments have been checked.
struct Product {
  cublasOperation_t transa = CUBLAS_OP_N;
  cublasOperation_t transb = CUBLAS_OP_N;
  int m = 0, n = 0, k = 0;
  float alpha = 1, beta = 0;
  const void* a = nullptr;
  const void* b = nullptr;
  void* c = nullptr;
  int lda = 0, ldb = 0, ldc = 0;
};

float Load(const void* p, cudaDataType_t type, long long i) {
  switch (type) {
    case CUDA_R_16BF:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case CUDA_R_16F:
      return __half2float(static_cast<const __half*>(p)[i]);
    default:
      return static_cast<const float*>(p)[i];
  }
}

void Store(void* p, cudaDataType_t type, long long i, float v) {
  switch (type) {
    case CUDA_R_16BF:
      static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
      break;
    case CUDA_R_16F:
      static_cast<__half*>(p)[i] = __float2half_rn(v);
      break;
    default:
      static_cast<float*>(p)[i] = v;
      break;
  }
}

// The f32 copy of a column-major matrix, same leading dimension.
std::vector<float> Widen(const void* p, cudaDataType_t type, int rows, int cols, int ld) {
  std::vector<float> out(static_cast<size_t>(MatrixSpan(rows, cols, ld)));
  for (int j = 0; j < cols; ++j) {
    for (int i = 0; i < rows; ++i) {
      const long long at = static_cast<long long>(j) * ld + i;
      out[at] = Load(p, type, at);
    }
  }
  return out;
}

CBLAS_TRANSPOSE Blas(cublasOperation_t op) { return op == CUBLAS_OP_N ? CblasNoTrans : CblasTrans; }

void Run(const Product& p, cudaDataType_t ab_type, cudaDataType_t c_type) {
  if (p.m == 0 || p.n == 0) return;
  const int a_rows = p.transa == CUBLAS_OP_N ? p.m : p.k;
  const int a_cols = p.transa == CUBLAS_OP_N ? p.k : p.m;
  const int b_rows = p.transb == CUBLAS_OP_N ? p.k : p.n;
  const int b_cols = p.transb == CUBLAS_OP_N ? p.n : p.k;
  std::vector<float> a_wide, b_wide, c_wide;
  const float* a = static_cast<const float*>(p.a);
  const float* b = static_cast<const float*>(p.b);
  float* c = static_cast<float*>(p.c);
  if (ab_type != CUDA_R_32F) {
    a_wide = Widen(p.a, ab_type, a_rows, a_cols, p.lda);
    b_wide = Widen(p.b, ab_type, b_rows, b_cols, p.ldb);
    a = a_wide.data();
    b = b_wide.data();
  }
  if (c_type != CUDA_R_32F) {
    // beta == 0 never reads C (it may hold NaN), as in BLAS and cuBLAS.
    c_wide.assign(static_cast<size_t>(MatrixSpan(p.m, p.n, p.ldc)), 0.0f);
    if (p.beta != 0.0f) c_wide = Widen(p.c, c_type, p.m, p.n, p.ldc);
    c = c_wide.data();
  }
  // OpenBLAS wants non-null operands and lda >= 1 even when k == 0.
  static const float kZero = 0.0f;
  cblas_sgemm(CblasColMajor, Blas(p.transa), Blas(p.transb), p.m, p.n, p.k, p.alpha,
              p.k == 0 ? &kZero : a, p.lda, p.k == 0 ? &kZero : b, p.ldb, p.beta, c, p.ldc);
  if (c_type != CUDA_R_32F) {
    for (int j = 0; j < p.n; ++j) {
      for (int i = 0; i < p.m; ++i) {
        const long long at = static_cast<long long>(j) * p.ldc + i;
        Store(p.c, c_type, at, c[at]);
      }
    }
  }
}

// "" when every matrix of `p` lies inside one live device allocation.
std::string CheckPlacement(const Product& p, cudaDataType_t ab_type, cudaDataType_t c_type) {
  const int ab = GemmTypeBytes(ab_type);
  const long long a_span =
      p.transa == CUBLAS_OP_N ? MatrixSpan(p.m, p.k, p.lda) : MatrixSpan(p.k, p.m, p.lda);
  const long long b_span =
      p.transb == CUBLAS_OP_N ? MatrixSpan(p.k, p.n, p.ldb) : MatrixSpan(p.n, p.k, p.ldb);
  const long long c_span = MatrixSpan(p.m, p.n, p.ldc);
  std::string why;
  if (p.m > 0 && p.n > 0 && p.k > 0) {
    why = simt::detail::CheckDeviceRange(p.a, a_span * ab);
    if (!why.empty()) return "A " + why;
    why = simt::detail::CheckDeviceRange(p.b, b_span * ab);
    if (!why.empty()) return "B " + why;
  }
  if (p.m > 0 && p.n > 0) {
    why = simt::detail::CheckDeviceRange(p.c, c_span * GemmTypeBytes(c_type));
    if (!why.empty()) return "C " + why;
  }
  return "";
}

std::string Describe(const char* api, const Product& p) {
  return absl::StrCat(api, "(transa=", p.transa == CUBLAS_OP_N ? "N" : "T",
                      ", transb=", p.transb == CUBLAS_OP_N ? "N" : "T", ", m=", p.m, ", n=", p.n,
                      ", k=", p.k, ", lda=", p.lda, ", ldb=", p.ldb, ", ldc=", p.ldc, ")");
}

cublasStatus_t Reject(const std::string& what) {
  Report(cudaErrorInvalidValue, what);
  return CUBLAS_STATUS_INVALID_VALUE;
}

}  // namespace

cublasStatus_t CreateGemmHandle(cudaStream_t stream, GemmHandle** handle) {
  *handle = new GemmHandle{stream};
  return CUBLAS_STATUS_SUCCESS;
}

void DestroyGemmHandle(GemmHandle* handle) { delete handle; }

cublasStatus_t SetGemmStream(GemmHandle* handle, cudaStream_t stream) {
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t Gemm(GemmHandle* handle, cublasOperation_t transa, cublasOperation_t transb, int m,
                    int n, int k, float alpha, const void* a, cudaDataType_t a_type, int lda,
                    const void* b, cudaDataType_t b_type, int ldb, float beta, void* c,
                    cudaDataType_t c_type, int ldc, GemmCompute /*compute*/) {
  return GemmStridedBatched(handle, transa, transb, m, n, k, alpha, a, a_type, lda, 0, b, b_type,
                            ldb, 0, beta, c, c_type, ldc, 0, 1);
}

cublasStatus_t GemmStridedBatched(GemmHandle* handle, cublasOperation_t transa,
                                  cublasOperation_t transb, int m, int n, int k, float alpha,
                                  const void* a, cudaDataType_t a_type, int lda, long long stride_a,
                                  const void* b, cudaDataType_t b_type, int ldb, long long stride_b,
                                  float beta, void* c, cudaDataType_t c_type, int ldc,
                                  long long stride_c, int batch_count, GemmCompute /*compute*/) {
  const Product first{transa, transb, m, n, k, alpha, beta, a, b, c, lda, ldb, ldc};
  const char* api = batch_count == 1 && stride_a == 0 ? "Gemm" : "GemmStridedBatched";
  if (const std::string why =
          CheckGemmArguments(transa, transb, m, n, k, a_type, lda, b_type, ldb, c_type, ldc, false);
      !why.empty()) {
    return Reject(absl::StrCat(Describe(api, first), ": ", why));
  }
  if (batch_count < 0 || stride_a < 0 || stride_b < 0 || stride_c < 0) {
    return Reject(Describe(api, first) + ": negative batch count or stride");
  }
  const int ab = GemmTypeBytes(a_type);
  const int cb = GemmTypeBytes(c_type);
  std::vector<Product> products;
  for (int i = 0; i < batch_count; ++i) {
    Product p = first;
    p.a = static_cast<const char*>(a) + i * stride_a * ab;
    p.b = static_cast<const char*>(b) + i * stride_b * ab;
    p.c = static_cast<char*>(c) + i * stride_c * cb;
    if (const std::string why = CheckPlacement(p, a_type, c_type); !why.empty()) {
      return Reject(absl::StrCat(Describe(api, p), " batch ", i, ": ", why));
    }
    products.push_back(p);
  }
  simt::detail::Enqueue(handle->stream, [products = std::move(products), a_type, c_type] {
    for (const Product& p : products) Run(p, a_type, c_type);
    return cudaSuccess;
  });
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t GemmGroupedBatched(GemmHandle* handle, const cublasOperation_t transa[],
                                  const cublasOperation_t transb[], const int m[], const int n[],
                                  const int k[], const float alpha[], const void* const a[],
                                  cudaDataType_t a_type, const int lda[], const void* const b[],
                                  cudaDataType_t b_type, const int ldb[], const float beta[],
                                  void* const c[], cudaDataType_t c_type, const int ldc[],
                                  int group_count, const int group_size[]) {
  if (group_count < 0) return Reject("GemmGroupedBatched: negative group_count");
  // The per-group arrays are host memory, read now; the pointer arrays are
  // device memory, read when the products run.
  std::vector<Product> groups;
  std::vector<int> sizes;
  long long total = 0;
  for (int g = 0; g < group_count; ++g) {
    const Product p{transa[g], transb[g], m[g],    n[g],   k[g],   alpha[g], beta[g],
                    nullptr,   nullptr,   nullptr, lda[g], ldb[g], ldc[g]};
    if (const std::string why = CheckGemmArguments(transa[g], transb[g], m[g], n[g], k[g], a_type,
                                                   lda[g], b_type, ldb[g], c_type, ldc[g], true);
        !why.empty() || group_size[g] < 0) {
      return Reject(absl::StrCat(Describe("GemmGroupedBatched", p), " group ", g, ": ",
                                 why.empty() ? "negative group_size" : why));
    }
    groups.push_back(p);
    sizes.push_back(group_size[g]);
    total += group_size[g];
  }
  const long long pointer_bytes = total * static_cast<long long>(sizeof(void*));
  for (const auto& [name, array] :
       {std::pair<const char*, const void*>{"Aarray", a}, {"Barray", b}, {"Carray", c}}) {
    if (total == 0) break;
    if (const std::string why = simt::detail::CheckDeviceRange(array, pointer_bytes);
        !why.empty()) {
      return Reject(absl::StrCat("GemmGroupedBatched: ", name, " ", why));
    }
  }
  simt::detail::Enqueue(handle->stream, [groups = std::move(groups), sizes = std::move(sizes), a, b,
                                         c, a_type, c_type] {
    long long at = 0;
    for (size_t g = 0; g < groups.size(); ++g) {
      for (int i = 0; i < sizes[g]; ++i, ++at) {
        Product p = groups[g];
        p.a = a[at];
        p.b = b[at];
        p.c = c[at];
        if (const std::string why = CheckPlacement(p, a_type, c_type); !why.empty()) {
          return Report(cudaErrorIllegalAddress,
                        absl::StrCat(Describe("GemmGroupedBatched", p), " group ", g, " product ",
                                     i, ": ", why));
        }
        Run(p, a_type, c_type);
      }
    }
    return cudaSuccess;
  });
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace switchserve::cuda
