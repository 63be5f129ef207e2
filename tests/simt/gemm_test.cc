// The GEMM wrapper against a naive column-major product in double, for every
// transpose combination, padded leading dimensions and batch strides, f32 /
// bf16 / f16 inputs with f32 or same-type outputs; strided-batched and
// grouped products; and the arguments both builds reject.
#include "kernels/cuda/gemm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tests/simt/simt_test_util.h"

#if defined(SWITCHSERVE_SIMT_EMULATION)
#include <gmock/gmock.h>

#include "kernels/cuda/simt_control.h"
#endif

namespace switchserve::simt_test {
namespace {

using cuda::GemmCompute;
using cuda::GemmHandle;

// Host values of a typed device buffer, rounded to the type.
std::vector<unsigned char> Encode(const std::vector<float>& v, cudaDataType_t type) {
  std::vector<unsigned char> bytes(v.size() * cuda::GemmTypeBytes(type));
  for (size_t i = 0; i < v.size(); ++i) {
    if (type == CUDA_R_32F) {
      std::memcpy(&bytes[4 * i], &v[i], 4);
    } else if (type == CUDA_R_16BF) {
      const __nv_bfloat16 h = __float2bfloat16_rn(v[i]);
      std::memcpy(&bytes[2 * i], &h, 2);
    } else {
      const __half h = __float2half_rn(v[i]);
      std::memcpy(&bytes[2 * i], &h, 2);
    }
  }
  return bytes;
}

std::vector<float> Decode(const std::vector<unsigned char>& bytes, cudaDataType_t type) {
  const int size = cuda::GemmTypeBytes(type);
  std::vector<float> v(bytes.size() / size);
  for (size_t i = 0; i < v.size(); ++i) {
    if (type == CUDA_R_32F) {
      std::memcpy(&v[i], &bytes[4 * i], 4);
    } else if (type == CUDA_R_16BF) {
      __nv_bfloat16 h;
      std::memcpy(&h, &bytes[2 * i], 2);
      v[i] = __bfloat162float(h);
    } else {
      __half h;
      std::memcpy(&h, &bytes[2 * i], 2);
      v[i] = __half2float(h);
    }
  }
  return v;
}

const char* Name(cudaDataType_t type) {
  return type == CUDA_R_32F ? "f32" : type == CUDA_R_16BF ? "bf16" : "f16";
}

// One product's operands on the host (values as stored, already rounded).
struct Case {
  cublasOperation_t ta, tb;
  int m, n, k, lda, ldb, ldc;
  float alpha, beta;
  cudaDataType_t ab, c;
};

// C = alpha op(A) op(B) + beta C0 in double, checked element by element;
// C's padding rows keep C0.
void ExpectProduct(const Case& p, const std::vector<float>& a, const std::vector<float>& b,
                   const std::vector<float>& c0, const std::vector<float>& c,
                   const std::string& what) {
  const double rounding = p.c == CUDA_R_16BF ? 1.0 / 256 : p.c == CUDA_R_16F ? 1.0 / 2048 : 0.0;
  for (int j = 0; j < p.n; ++j) {
    for (int i = 0; i < p.ldc; ++i) {
      const size_t at = static_cast<size_t>(j) * p.ldc + i;
      if (i >= p.m) {
        ASSERT_TRUE(std::memcmp(&c[at], &c0[at], 4) == 0 ||
                    (std::isnan(c[at]) && std::isnan(c0[at])))
            << what << ": padding of C changed at (" << i << ", " << j << ")";
        continue;
      }
      double sum = 0, magnitude = 0;
      for (int q = 0; q < p.k; ++q) {
        const double x = p.ta == CUBLAS_OP_N ? a[i + static_cast<size_t>(q) * p.lda]
                                             : a[q + static_cast<size_t>(i) * p.lda];
        const double y = p.tb == CUBLAS_OP_N ? b[q + static_cast<size_t>(j) * p.ldb]
                                             : b[j + static_cast<size_t>(q) * p.ldb];
        sum += x * y;
        magnitude += std::fabs(x * y);
      }
      double want = p.alpha * sum;
      magnitude *= std::fabs(p.alpha);
      if (p.beta != 0.0f) {
        want += p.beta * c0[at];
        magnitude += std::fabs(p.beta * c0[at]);
      }
      const double tolerance = 1e-5 * magnitude + 1e-6 + rounding * std::fabs(want);
      ASSERT_NEAR(c[at], want, tolerance) << what << " at (" << i << ", " << j << ")";
    }
  }
}

long long Span(int rows, int cols, int ld) { return cuda::MatrixSpan(rows, cols, ld); }

struct Operands {
  std::vector<float> a, b, c0;  // stored values (rounded to their types)
};

Operands MakeOperands(const Case& p, long long a_span, long long b_span, long long c_span,
                      uint64_t seed) {
  Operands o;
  o.a = Decode(Encode(RandomFloats(a_span, seed), p.ab), p.ab);
  o.b = Decode(Encode(RandomFloats(b_span, seed + 1), p.ab), p.ab);
  if (p.beta != 0.0f) {
    o.c0 = Decode(Encode(RandomFloats(c_span, seed + 2), p.c), p.c);
  } else {
    o.c0.assign(c_span, std::nanf(""));  // beta = 0 must not read C
  }
  return o;
}

class SimtGemm : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!DeviceAvailable()) GTEST_SKIP() << "no usable CUDA device";
    ASSERT_EQ(cuda::CreateGemmHandle(nullptr, &handle_), CUBLAS_STATUS_SUCCESS);
  }
  void TearDown() override { cuda::DestroyGemmHandle(handle_); }
  GemmHandle* handle_ = nullptr;
};

const cudaDataType_t kTypes[][2] = {{CUDA_R_32F, CUDA_R_32F},
                                    {CUDA_R_16BF, CUDA_R_32F},
                                    {CUDA_R_16BF, CUDA_R_16BF},
                                    {CUDA_R_16F, CUDA_R_32F},
                                    {CUDA_R_16F, CUDA_R_16F}};

TEST_F(SimtGemm, GemmEveryTransposeAndTypeWithPaddedLeadingDimensions) {
  struct Shape {
    int m, n, k;
  };
  for (const Shape s : {Shape{7, 5, 3}, Shape{33, 1, 17}, Shape{1, 257, 9}, Shape{6, 4, 0}}) {
    for (const auto& types : kTypes) {
      for (const cublasOperation_t ta : {CUBLAS_OP_N, CUBLAS_OP_T}) {
        for (const cublasOperation_t tb : {CUBLAS_OP_N, CUBLAS_OP_T}) {
          for (const float beta : {0.0f, 0.5f}) {
            Case p{ta, tb, s.m, s.n, s.k, 0, 0, s.m + 2, 1.5f, beta, types[0], types[1]};
            const int a_rows = ta == CUBLAS_OP_N ? s.m : s.k,
                      a_cols = ta == CUBLAS_OP_N ? s.k : s.m;
            const int b_rows = tb == CUBLAS_OP_N ? s.k : s.n,
                      b_cols = tb == CUBLAS_OP_N ? s.n : s.k;
            p.lda = std::max(1, a_rows) + 3;
            p.ldb = std::max(1, b_rows) + 1;
            const std::string what = std::string(Name(p.ab)) + "->" + Name(p.c) + " " +
                                     (ta == CUBLAS_OP_N ? "N" : "T") +
                                     (tb == CUBLAS_OP_N ? "N" : "T") + " m=" + std::to_string(s.m) +
                                     " n=" + std::to_string(s.n) + " k=" + std::to_string(s.k) +
                                     " beta=" + std::to_string(beta);
            const long long a_span = Span(a_rows, a_cols, p.lda);
            const long long b_span = Span(b_rows, b_cols, p.ldb);
            const long long c_span = Span(s.m + 2, s.n, p.ldc);
            const Operands o = MakeOperands(p, std::max(1ll, a_span), std::max(1ll, b_span), c_span,
                                            s.m * 1000 + s.k);
            DeviceArray<unsigned char> d_a(Encode(o.a, p.ab)), d_b(Encode(o.b, p.ab)),
                d_c(Encode(o.c0, p.c));
            ASSERT_EQ(cuda::Gemm(handle_, ta, tb, s.m, s.n, s.k, p.alpha, d_a.get(), p.ab, p.lda,
                                 d_b.get(), p.ab, p.ldb, p.beta, d_c.get(), p.c, p.ldc),
                      CUBLAS_STATUS_SUCCESS)
                << what;
            ExpectProduct(p, o.a, o.b, Decode(Encode(o.c0, p.c), p.c), Decode(d_c.Download(), p.c),
                          what);
          }
        }
      }
    }
  }
}

TEST_F(SimtGemm, StridedBatchedProductsUseTheirStrides) {
  const int batch = 3;
  for (const auto& types : kTypes) {
    for (const bool shared_a : {false, true}) {
      Case p{CUBLAS_OP_T, CUBLAS_OP_N, 9, 7, 5, 8, 6, 10, 0.75f, 0.25f, types[0], types[1]};
      const long long a_span = Span(p.k, p.m, p.lda), b_span = Span(p.k, p.n, p.ldb);
      const long long c_span = Span(p.ldc, p.n, p.ldc);
      const long long stride_a = shared_a ? 0 : a_span + 5, stride_b = b_span + 2;
      const long long stride_c = c_span + 3;
      const Operands o =
          MakeOperands(p, a_span + stride_a * (batch - 1), b_span + stride_b * (batch - 1),
                       c_span + stride_c * (batch - 1), 77);
      DeviceArray<unsigned char> d_a(Encode(o.a, p.ab)), d_b(Encode(o.b, p.ab)),
          d_c(Encode(o.c0, p.c));
      ASSERT_EQ(cuda::GemmStridedBatched(handle_, p.ta, p.tb, p.m, p.n, p.k, p.alpha, d_a.get(),
                                         p.ab, p.lda, stride_a, d_b.get(), p.ab, p.ldb, stride_b,
                                         p.beta, d_c.get(), p.c, p.ldc, stride_c, batch),
                CUBLAS_STATUS_SUCCESS);
      const std::vector<float> c = Decode(d_c.Download(), p.c);
      const std::vector<float> c0 = Decode(Encode(o.c0, p.c), p.c);
      for (int i = 0; i < batch; ++i) {
        auto slice = [](const std::vector<float>& v, long long from, long long size) {
          return std::vector<float>(v.begin() + from, v.begin() + from + size);
        };
        ExpectProduct(p, slice(o.a, i * stride_a, a_span), slice(o.b, i * stride_b, b_span),
                      slice(c0, i * stride_c, c_span), slice(c, i * stride_c, c_span),
                      std::string(Name(p.ab)) + "->" + Name(p.c) + " batch " + std::to_string(i));
      }
      // The gaps between C's matrices are untouched.
      for (int i = 0; i + 1 < batch; ++i) {
        for (long long g = 0; g < stride_c - c_span; ++g) {
          const long long at = i * stride_c + c_span + g;
          ASSERT_TRUE(std::memcmp(&c[at], &c0[at], 4) == 0) << "gap after batch " << i;
        }
      }
    }
  }
}

TEST_F(SimtGemm, GroupedProductsTakeEachGroupsShapeAndDevicePointerArrays) {
  struct Group {
    cublasOperation_t ta, tb;
    int m, n, k, size;
    float alpha, beta;
  };
  const std::vector<Group> groups = {{CUBLAS_OP_N, CUBLAS_OP_T, 5, 3, 7, 2, 1.0f, 0.0f},
                                     {CUBLAS_OP_T, CUBLAS_OP_N, 1, 9, 4, 3, 2.0f, 0.5f}};
  for (const cudaDataType_t type : {CUDA_R_32F, CUDA_R_16BF, CUDA_R_16F}) {
    std::vector<cublasOperation_t> ta, tb;
    std::vector<int> m, n, k, lda, ldb, ldc, sizes;
    std::vector<float> alpha, beta;
    std::vector<Case> cases;
    std::vector<Operands> operands;
    std::vector<std::unique_ptr<DeviceArray<unsigned char>>> buffers;
    std::vector<const void*> a_ptrs, b_ptrs;
    std::vector<void*> c_ptrs;
    for (const Group& g : groups) {
      Case p{g.ta, g.tb, g.m, g.n, g.k, 0, 0, g.m + 1, g.alpha, g.beta, type, type};
      p.lda = (g.ta == CUBLAS_OP_N ? g.m : g.k) + 2;
      p.ldb = (g.tb == CUBLAS_OP_N ? g.k : g.n) + 1;
      ta.push_back(g.ta), tb.push_back(g.tb), m.push_back(g.m), n.push_back(g.n);
      k.push_back(g.k), lda.push_back(p.lda), ldb.push_back(p.ldb), ldc.push_back(p.ldc);
      alpha.push_back(g.alpha), beta.push_back(g.beta), sizes.push_back(g.size);
      for (int i = 0; i < g.size; ++i) {
        const Operands o = MakeOperands(
            p, Span(g.ta == CUBLAS_OP_N ? g.m : g.k, g.ta == CUBLAS_OP_N ? g.k : g.m, p.lda),
            Span(g.tb == CUBLAS_OP_N ? g.k : g.n, g.tb == CUBLAS_OP_N ? g.n : g.k, p.ldb),
            Span(p.ldc, g.n, p.ldc), 100 + cases.size());
        for (const auto* values : {&o.a, &o.b, &o.c0}) {
          const cudaDataType_t t = values == &o.c0 ? p.c : p.ab;
          buffers.push_back(std::make_unique<DeviceArray<unsigned char>>(Encode(*values, t)));
        }
        a_ptrs.push_back(buffers[buffers.size() - 3]->get());
        b_ptrs.push_back(buffers[buffers.size() - 2]->get());
        c_ptrs.push_back(buffers[buffers.size() - 1]->get());
        cases.push_back(p);
        operands.push_back(o);
      }
    }
    DeviceArray<const void*> d_a(a_ptrs), d_b(b_ptrs);
    DeviceArray<void*> d_c(c_ptrs);
    ASSERT_EQ(cuda::GemmGroupedBatched(handle_, ta.data(), tb.data(), m.data(), n.data(), k.data(),
                                       alpha.data(), d_a.get(), type, lda.data(), d_b.get(), type,
                                       ldb.data(), beta.data(), d_c.get(), type, ldc.data(),
                                       static_cast<int>(groups.size()), sizes.data()),
              CUBLAS_STATUS_SUCCESS);
    for (size_t i = 0; i < cases.size(); ++i) {
      const Case& p = cases[i];
      ExpectProduct(p, operands[i].a, operands[i].b, Decode(Encode(operands[i].c0, p.c), p.c),
                    Decode(buffers[3 * i + 2]->Download(), p.c),
                    std::string(Name(type)) + " product " + std::to_string(i));
    }
  }
}

// What cuBLAS rejects, both builds reject (the emulated one also says why).
TEST_F(SimtGemm, RejectsArgumentsCublasRejects) {
#if defined(SWITCHSERVE_SIMT_EMULATION)
  simt::ScopedErrorCapture capture;
#endif
  DeviceArray<float> buffer(64);
  float* p = buffer.get();
  EXPECT_EQ(cuda::Gemm(handle_, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, 1, p, CUDA_R_32F, 3, p,
                       CUDA_R_32F, 4, 0, p, CUDA_R_32F, 4),
            CUBLAS_STATUS_INVALID_VALUE);  // lda < m
  EXPECT_EQ(cuda::Gemm(handle_, CUBLAS_OP_T, CUBLAS_OP_N, 4, 4, 5, 1, p, CUDA_R_32F, 4, p,
                       CUDA_R_32F, 5, 0, p, CUDA_R_32F, 4),
            CUBLAS_STATUS_INVALID_VALUE);  // A transposed: lda < k
  EXPECT_EQ(cuda::Gemm(handle_, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, 1, p, CUDA_R_16BF, 4, p,
                       CUDA_R_16F, 4, 0, p, CUDA_R_32F, 4),
            CUBLAS_STATUS_INVALID_VALUE);  // mixed input types
  EXPECT_EQ(cuda::Gemm(handle_, CUBLAS_OP_N, CUBLAS_OP_N, 4, 4, 4, 1, p, CUDA_R_32F, 4, p,
                       CUDA_R_32F, 4, 0, p, CUDA_R_16BF, 4),
            CUBLAS_STATUS_INVALID_VALUE);  // f32 in, bf16 out
#if defined(SWITCHSERVE_SIMT_EMULATION)
  EXPECT_THAT(capture.messages().at(0), ::testing::HasSubstr("lda=3 < 4"));
  EXPECT_THAT(capture.messages().at(1), ::testing::HasSubstr("lda=4 < 5"));
#endif
}

#if defined(SWITCHSERVE_SIMT_EMULATION)
// The emulated wrapper checks that every matrix lies in device memory.
TEST_F(SimtGemm, EmulatedWrapperRejectsMatricesOutsideTheirAllocation) {
  simt::ScopedErrorCapture capture;
  DeviceArray<float> a(4 * 5 - 1), b(5 * 3), c(4 * 3);  // A is one element short
  EXPECT_EQ(cuda::Gemm(handle_, CUBLAS_OP_N, CUBLAS_OP_N, 4, 3, 5, 1, a.get(), CUDA_R_32F, 4,
                       b.get(), CUDA_R_32F, 5, 0, c.get(), CUDA_R_32F, 4),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_THAT(capture.messages().at(0), ::testing::HasSubstr("A ["));
  EXPECT_THAT(capture.messages().at(0), ::testing::HasSubstr("runs past the end"));
  DeviceArray<float> full_a(5 * 4);
  std::vector<float> host(15);
  EXPECT_EQ(cuda::Gemm(handle_, CUBLAS_OP_T, CUBLAS_OP_N, 4, 3, 5, 1, full_a.get(), CUDA_R_32F, 5,
                       host.data(), CUDA_R_32F, 5, 0, c.get(), CUDA_R_32F, 4),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_THAT(capture.messages().at(1), ::testing::HasSubstr("B 0x"));
  EXPECT_THAT(capture.messages().at(1), ::testing::HasSubstr("host memory"));
}
#endif

}  // namespace
}  // namespace switchserve::simt_test
