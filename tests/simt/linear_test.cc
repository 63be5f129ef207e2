// The batch-invariant linear kernels (kernels/cuda/linear.h) against a
// float64 reference, for every weight type and layout, dense and grouped by
// expert; and the property they exist for: a row's result is bitwise the same
// whatever the number of rows around it and whichever tile shape runs it.
#include "kernels/cuda/linear.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "tests/simt/simt_test_util.h"

namespace switchserve::simt_test {
namespace {

using cuda::Activation;
using cuda::LinearEpilogue;
using cuda::LinearKernelChoice;
using cuda::LinearWeights;
using cuda::WeightLayout;
using cuda::WeightType;

// f32 sums of up to a few hundred products of magnitude <= 1.
constexpr double kTolerance = 2e-5;

double Act(Activation act, double x) {
  switch (act) {
    case Activation::kRelu:
      return x > 0 ? x : 0;
    case Activation::kGelu:
      return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
    case Activation::kSilu:
      return x / (1 + std::exp(-x));
    case Activation::kNone:
      break;
  }
  return x;
}

// Weights of `type` on the device, and the values they hold, widened.
struct Weights {
  std::vector<float> values;
  std::unique_ptr<DeviceArray<float>> f32;
  std::unique_ptr<DeviceArray<__nv_bfloat16>> bf16;
  std::unique_ptr<DeviceArray<__half>> f16;

  Weights(const std::vector<float>& w, WeightType type) {
    switch (type) {
      case WeightType::kF32:
        values = w;
        f32 = std::make_unique<DeviceArray<float>>(w);
        break;
      case WeightType::kBf16:
        bf16 = std::make_unique<DeviceArray<__nv_bfloat16>>(ToBf16(w));
        values = Widen(ToBf16(w));
        break;
      case WeightType::kF16:
        f16 = std::make_unique<DeviceArray<__half>>(ToHalf(w));
        values = Widen(ToHalf(w));
        break;
    }
  }
  const void* data(WeightType type) const {
    return type == WeightType::kF32    ? static_cast<const void*>(f32->get())
           : type == WeightType::kBf16 ? static_cast<const void*>(bf16->get())
                                       : static_cast<const void*>(f16->get());
  }
};

// W[n, k] of matrix `mat` as stored in `layout`.
double At(const std::vector<float>& w, WeightLayout layout, int64_t ld, int64_t stride, int mat,
          int n, int k) {
  const int64_t base = mat * stride;
  return layout == WeightLayout::kNK ? w[base + n * ld + k] : w[base + k * ld + n];
}

std::string Name(WeightType type, WeightLayout layout) {
  return std::string(type == WeightType::kF32    ? "f32"
                     : type == WeightType::kBf16 ? "bf16"
                                                 : "f16") +
         (layout == WeightLayout::kNK ? "/NK" : "/KN");
}

TEST(SimtLinear, DenseMatchesFloat64OnOddShapes) {
  SIMT_REQUIRE_DEVICE();
  for (const WeightType type : {WeightType::kF32, WeightType::kBf16, WeightType::kF16}) {
    for (const WeightLayout layout : {WeightLayout::kNK, WeightLayout::kKN}) {
      for (const auto& [rows, k, n, kernel] : {std::tuple{1, 7, 5, LinearKernelChoice::kFewRows},
                                               {3, 112, 33, LinearKernelChoice::kTiles},
                                               {9, 33, 130, LinearKernelChoice::kFewRows},
                                               {9, 33, 130, LinearKernelChoice::kTiles},
                                               {70, 100, 65, LinearKernelChoice::kFewRows},
                                               {70, 100, 65, LinearKernelChoice::kTiles}}) {
        SCOPED_TRACE(Name(type, layout) + " rows=" + std::to_string(rows) +
                     " k=" + std::to_string(k) + " n=" + std::to_string(n) +
                     (kernel == LinearKernelChoice::kTiles ? " tiles" : " few rows"));
        const int64_t lda = k + 3, ldc = n + 2;
        const int64_t ldw = (layout == WeightLayout::kNK ? k : n) + 1;
        const int64_t w_size = (layout == WeightLayout::kNK ? n : k) * ldw;
        const std::vector<float> a = RandomFloats(rows * lda, rows * 31 + k);
        const Weights w(RandomFloats(w_size, n * 17 + k), type);
        const std::vector<float> bias = RandomFloats(n, 5);
        const std::vector<float> initial = RandomFloats(rows * ldc, 9);
        for (const bool accumulate : {false, true}) {
          LinearEpilogue epilogue;
          epilogue.alpha = 0.75f;
          epilogue.bias = nullptr;
          epilogue.accumulate = accumulate;
          epilogue.activation = accumulate ? Activation::kNone : Activation::kGelu;
          const std::vector<float> out = InEveryOrder([&] {
            DeviceArray<float> d_a(a), d_bias(bias), d_out(initial);
            LinearEpilogue e = epilogue;
            e.bias = d_bias.get();
            const LinearWeights lw{w.data(type), type, layout, ldw, 0};
            EXPECT_EQ(cuda::LaunchLinear(d_a.get(), lda, rows, k, lw, n, e, d_out.get(), ldc,
                                         nullptr, kernel),
                      cudaSuccess);
            return d_out.Download();
          });
          for (int m = 0; m < rows; ++m) {
            for (int c = 0; c < ldc; ++c) {
              const float got = out[m * ldc + c];
              if (c >= n) {  // padding columns untouched
                ASSERT_EQ(got, initial[m * ldc + c]);
                continue;
              }
              double sum = 0;
              for (int i = 0; i < k; ++i) {
                sum += static_cast<double>(a[m * lda + i]) * At(w.values, layout, ldw, 0, 0, c, i);
              }
              double want = 0.75 * sum + bias[c];
              want = accumulate ? initial[m * ldc + c] + want : Act(Activation::kGelu, want);
              ASSERT_NEAR(got, want, kTolerance * (1 + std::fabs(want))) << m << "," << c;
            }
          }
        }
      }
    }
  }
}

// Row r of a 1-row product and of 7-, 70- and 129-row ones, each run by the
// few-rows kernel and by 64 x 64 tiles, the row at a different place each
// time: bitwise equal, for every weight type and layout, with k a whole number
// of chunks (16-byte loads along k) and not, and with more chunks than the
// few-rows kernel has warps (two rounds of chunk sums). So the launcher may
// pick either kernel for any shape. And the same matrix stored n x k or k x n
// gives the same bits.
TEST(SimtLinear, ARowsResultDoesNotDependOnTheBatchOrTheLayout) {
  SIMT_REQUIRE_DEVICE();
  const int n = 72;
  for (const WeightType type : {WeightType::kF32, WeightType::kBf16, WeightType::kF16}) {
    for (const int k : {100, 128, 1000}) {
      const std::vector<float> nk = RandomFloats(static_cast<size_t>(n) * k, 78);
      std::vector<float> kn(nk.size());
      for (int c = 0; c < n; ++c) {
        for (int j = 0; j < k; ++j)
          kn[static_cast<size_t>(j) * n + c] = nk[static_cast<size_t>(c) * k + j];
      }
      std::vector<float> alone_nk;
      for (const WeightLayout layout : {WeightLayout::kNK, WeightLayout::kKN}) {
        SCOPED_TRACE(Name(type, layout) + " k=" + std::to_string(k));
        const std::vector<float> probe = RandomFloats(k, 77);
        const int64_t ldw = layout == WeightLayout::kNK ? k : n;
        const Weights w(layout == WeightLayout::kNK ? nk : kn, type);
        const LinearWeights lw{w.data(type), type, layout, ldw, 0};
        auto row_of = [&](int rows, int at, LinearKernelChoice kernel) {
          std::vector<float> a = RandomFloats(static_cast<size_t>(rows) * k, rows);
          std::copy(probe.begin(), probe.end(), a.begin() + static_cast<int64_t>(at) * k);
          DeviceArray<float> d_a(a), d_out(static_cast<size_t>(rows) * n);
          EXPECT_EQ(cuda::LaunchLinear(d_a.get(), k, rows, k, lw, n, LinearEpilogue{}, d_out.get(),
                                       n, nullptr, kernel),
                    cudaSuccess);
          const std::vector<float> out = d_out.Download();
          return std::vector<float>(out.begin() + static_cast<int64_t>(at) * n,
                                    out.begin() + static_cast<int64_t>(at + 1) * n);
        };
        const std::vector<float> alone = row_of(1, 0, LinearKernelChoice::kAuto);
        for (const LinearKernelChoice kernel :
             {LinearKernelChoice::kFewRows, LinearKernelChoice::kTiles}) {
          for (const auto& [rows, at] : {std::pair{7, 3}, {7, 6}, {70, 0}, {70, 65}, {129, 100}}) {
            const std::vector<float> got = row_of(rows, at, kernel);
            EXPECT_EQ(std::memcmp(got.data(), alone.data(), n * sizeof(float)), 0)
                << rows << " rows, at " << at
                << (kernel == LinearKernelChoice::kTiles ? ", tiles" : ", few rows");
          }
        }
        if (layout == WeightLayout::kNK) {
          alone_nk = alone;
        } else {
          EXPECT_EQ(std::memcmp(alone.data(), alone_nk.data(), n * sizeof(float)), 0)
              << "k x n storage changed the bits";
        }
      }
    }
  }
}

// More row blocks than a grid's y holds (65,535): 8-row groups (the few-rows
// kernel, which every router's product takes) and 64-row tiles past it, each
// row the fmaf chain it is alone. Blocks past the limit's first rows take a
// second row block: the rows there, and the last, are checked.
TEST(SimtLinear, RowsPastTheGridLimitAreComputed) {
  SIMT_REQUIRE_DEVICE();
  const int k = 3, n = 2;
  const std::vector<float> w = RandomFloats(static_cast<size_t>(k) * n, 12);
  for (const auto& [rows, kernel] : {std::pair{65535 * 8 + 9, LinearKernelChoice::kAuto},
                                     {65535 * 64 + 65, LinearKernelChoice::kTiles}}) {
    SCOPED_TRACE(std::to_string(rows) + " rows" +
                 (kernel == LinearKernelChoice::kTiles ? ", tiles" : ", few rows"));
    const std::vector<float> a = RandomFloats(static_cast<size_t>(rows) * k, 13);
    DeviceArray<float> d_a(a), d_w(w), d_out(static_cast<size_t>(rows) * n);
    const LinearWeights lw{d_w.get(), WeightType::kF32, WeightLayout::kKN, n, 0};
    ASSERT_CUDA(cuda::LaunchLinear(d_a.get(), k, rows, k, lw, n, LinearEpilogue{}, d_out.get(), n,
                                   nullptr, kernel));
    const std::vector<float> out = d_out.Download();
    for (int64_t m = 0; m < rows; ++m) {
      for (int c = 0; c < n; ++c) {
        float sum = 0.0f;
        for (int i = 0; i < k; ++i) sum = std::fmaf(a[m * k + i], w[i * n + c], sum);
        ASSERT_EQ(out[m * n + c], 0.0f + sum) << "row " << m << " column " << c;
      }
    }
  }
}

// Grouped by expert: two routers (heads) of E = 3 experts, tokens gathered
// through a_rows, each head reading its own columns of a; and a shared router.
TEST(SimtLinear, GroupedMatchesFloat64) {
  SIMT_REQUIRE_DEVICE();
  const int E = 3, heads = 2, k = 20, n = 9, tokens = 6;
  const int64_t slot_stride = 12;
  for (const bool shared : {false, true}) {
    for (const auto& [layout, kernel] : {std::pair{WeightLayout::kNK, LinearKernelChoice::kFewRows},
                                         {WeightLayout::kKN, LinearKernelChoice::kFewRows},
                                         {WeightLayout::kNK, LinearKernelChoice::kTiles},
                                         {WeightLayout::kKN, LinearKernelChoice::kTiles}}) {
      SCOPED_TRACE(std::string(shared ? "shared router " : "per-head routers ") +
                   Name(WeightType::kBf16, layout) +
                   (kernel == LinearKernelChoice::kTiles ? " tiles" : " few rows"));
      // Router r's experts own slots [offsets[r][e], offsets[r][e + 1]).
      const std::vector<int32_t> offsets = {0, 2, 2, 5, 0, 4, 6, 7};
      std::vector<int32_t> a_rows(2 * slot_stride, -1);
      for (int s = 0; s < 5; ++s) a_rows[s] = (s * 5) % tokens;
      for (int s = 0; s < 7; ++s) a_rows[slot_stride + s] = (s * 2 + 1) % tokens;
      const int64_t lda = heads * k;
      const std::vector<float> a = RandomFloats(tokens * lda, 3);
      const int64_t ldw = layout == WeightLayout::kNK ? k : n;
      const int64_t stride = static_cast<int64_t>(k) * n;
      const Weights w(RandomFloats(heads * E * stride, 4), WeightType::kBf16);
      const std::vector<float> bias = RandomFloats(heads * E * n, 6);
      const int64_t ldc = n;
      const std::vector<float> out = InEveryOrder([&] {
        DeviceArray<float> d_a(a), d_bias(bias), d_out(heads * slot_stride * ldc);
        DeviceArray<int32_t> d_offsets(offsets), d_rows(a_rows);
        cuda::GroupedRows rows;
        rows.offsets = d_offsets.get();
        rows.a_rows = d_rows.get();
        rows.slot_stride = slot_stride;
        rows.max_rows = 4;
        rows.n_experts = E;
        rows.heads = heads;
        rows.shared_router = shared;
        rows.a_head_cols = k;
        LinearEpilogue e;
        e.bias = d_bias.get();
        e.bias_stride = n;
        e.activation = Activation::kRelu;
        const LinearWeights lw{w.data(WeightType::kBf16), WeightType::kBf16, layout, ldw, stride};
        EXPECT_EQ(cuda::LaunchGroupedLinear(d_a.get(), lda, rows, k, lw, n, e, d_out.get(), ldc,
                                            nullptr, kernel),
                  cudaSuccess);
        return d_out.Download();
      });
      for (int h = 0; h < heads; ++h) {
        const int r = shared ? 0 : h;
        for (int e = 0; e < E; ++e) {
          for (int s = offsets[r * (E + 1) + e]; s < offsets[r * (E + 1) + e + 1]; ++s) {
            const int token = a_rows[r * slot_stride + s];
            for (int c = 0; c < n; ++c) {
              double sum = 0;
              for (int i = 0; i < k; ++i) {
                sum += static_cast<double>(a[token * lda + h * k + i]) *
                       At(w.values, layout, ldw, stride, h * E + e, c, i);
              }
              const double want = Act(Activation::kRelu, sum + bias[(h * E + e) * n + c]);
              const float got = out[(h * slot_stride + s) * ldc + c];
              ASSERT_NEAR(got, want, kTolerance * (1 + std::fabs(want)))
                  << "head " << h << " expert " << e << " slot " << s << " col " << c;
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace switchserve::simt_test
