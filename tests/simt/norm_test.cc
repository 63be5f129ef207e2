// RMSNorm / LayerNorm kernel against the CPU backend's NormRows, on odd
// shapes, under every thread order.
#include "kernels/cuda/norm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "tests/simt/simt_test_util.h"

namespace switchserve::simt_test {
namespace {

using cuda::NormType;

// Statistics in double on both, summed in other orders: a few ulp of the output.
constexpr float kTolerance = 2e-5f;

TEST(SimtNorm, MatchesTheCpuBackendOnOddShapes) {
  SIMT_REQUIRE_DEVICE();
  const float eps = 1e-5f;
  for (const int rows : {1, 7, 33, 257}) {
    for (const int d : {7, 100, 112, 1000}) {
      for (const NormType type : {NormType::kRms, NormType::kLayer}) {
        const bool layer = type == NormType::kLayer;
        SCOPED_TRACE(std::string(layer ? "LayerNorm" : "RMSNorm") +
                     " rows=" + std::to_string(rows) + " d=" + std::to_string(d));
        std::vector<float> x = RandomFloats(static_cast<size_t>(rows) * d, rows * 7919 + d, -3, 3);
        for (float& v : x) v += 0.5f;  // a mean LayerNorm has to remove
        const std::vector<float> weight = RandomFloats(d, d + 1, 0.5f, 1.5f);
        const std::vector<float> bias = RandomFloats(d, d + 2, -0.5f, 0.5f);
        std::vector<float> want(x.size());
        cpu::NormRows(layer ? NormKind::kLayerNorm : NormKind::kRmsNorm, eps, x.data(), rows, d,
                      weight.data(), layer ? bias.data() : nullptr, want.data());

        // One row more than needed: the kernel must leave it untouched.
        const size_t n = x.size();
        const auto [out, out_bf16] = InEveryOrder([&] {
          DeviceArray<float> d_x(x), d_weight(weight), d_bias(bias), d_out(n + d);
          DeviceArray<__nv_bfloat16> d_out_bf16(n + d);
          EXPECT_EQ(cuda::LaunchNormRows(type, eps, d_x.get(), rows, d, d_weight.get(),
                                         layer ? d_bias.get() : nullptr, d_out.get(),
                                         d_out_bf16.get(), nullptr),
                    cudaSuccess);
          return std::make_tuple(d_out.Download(), d_out_bf16.Download());
        });
        for (size_t i = 0; i < n; ++i) {
          ASSERT_NEAR(out[i], want[i], kTolerance * (1 + std::fabs(want[i]))) << "element " << i;
          const float rounded = __bfloat162float(out_bf16[i]);
          ASSERT_EQ(rounded, __bfloat162float(__float2bfloat16_rn(out[i]))) << "element " << i;
        }
        for (size_t i = n; i < n + d; ++i) {
          uint32_t bits;
          std::memcpy(&bits, &out[i], 4);
          ASSERT_EQ(bits, 0xffffffffu) << "wrote past the last row at " << i;
        }
      }
    }
  }
}

// Rows too large to square in f32 (|x| ~ 1e20, and up to 3e38, near f32's
// largest): the statistics in double, as on the CPU, normalise them (a norm
// does not depend on the row's scale) where f32 sums overflowed to a zero
// RMSNorm row and a NaN LayerNorm one. The ordinary row beside them is
// unaffected.
TEST(SimtNorm, RowsBeyondF32SquaresNormaliseAsOnTheCpu) {
  SIMT_REQUIRE_DEVICE();
  const float eps = 1e-5f;
  const int rows = 3, d = 32;
  std::vector<float> x = RandomFloats(static_cast<size_t>(rows) * d, 31, -3, 3);
  for (int i = 0; i < d; ++i) x[i] *= 1e20f;                           // row 0: up to 3e20
  for (int i = 0; i < d; ++i) x[d + i] = i % 2 == 0 ? 3e38f : -1e38f;  // row 1: 3e38, -1e38
  const std::vector<float> weight = RandomFloats(d, 32, 0.5f, 1.5f);
  const std::vector<float> bias = RandomFloats(d, 33, -0.5f, 0.5f);
  for (const NormType type : {NormType::kRms, NormType::kLayer}) {
    const bool layer = type == NormType::kLayer;
    SCOPED_TRACE(layer ? "LayerNorm" : "RMSNorm");
    std::vector<float> want(x.size());
    cpu::NormRows(layer ? NormKind::kLayerNorm : NormKind::kRmsNorm, eps, x.data(), rows, d,
                  weight.data(), layer ? bias.data() : nullptr, want.data());
    const std::vector<float> out = InEveryOrder([&] {
      DeviceArray<float> d_x(x), d_weight(weight), d_bias(bias), d_out(x.size());
      EXPECT_EQ(cuda::LaunchNormRows(type, eps, d_x.get(), rows, d, d_weight.get(),
                                     layer ? d_bias.get() : nullptr, d_out.get(), nullptr, nullptr),
                cudaSuccess);
      return d_out.Download();
    });
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_TRUE(std::isfinite(want[i])) << "element " << i;
      ASSERT_NEAR(out[i], want[i], kTolerance * (1 + std::fabs(want[i]))) << "element " << i;
    }
  }
}

TEST(SimtNorm, EitherOutputMayBeOmitted) {
  SIMT_REQUIRE_DEVICE();
  const int rows = 3, d = 40;
  const std::vector<float> x = RandomFloats(rows * d, 11);
  const std::vector<float> weight(d, 1.0f);
  DeviceArray<float> d_x(x), d_weight(weight), d_out(rows * d);
  DeviceArray<__nv_bfloat16> d_out_bf16(rows * d);
  ASSERT_CUDA(cuda::LaunchNormRows(NormType::kRms, 1e-6f, d_x.get(), rows, d, d_weight.get(),
                                   nullptr, nullptr, d_out_bf16.get(), nullptr));
  ASSERT_CUDA(cuda::LaunchNormRows(NormType::kRms, 1e-6f, d_x.get(), rows, d, d_weight.get(),
                                   nullptr, d_out.get(), nullptr, nullptr));
  const std::vector<float> out = d_out.Download();
  const std::vector<float> out_bf16 = Widen(d_out_bf16.Download());
  for (int i = 0; i < rows * d; ++i) {
    EXPECT_EQ(out_bf16[i], __bfloat162float(__float2bfloat16_rn(out[i])));
  }
  ASSERT_CUDA(cuda::LaunchNormRows(NormType::kRms, 1e-6f, d_x.get(), 0, d, d_weight.get(), nullptr,
                                   d_out.get(), nullptr, nullptr));  // no rows: no launch
}

}  // namespace
}  // namespace switchserve::simt_test
