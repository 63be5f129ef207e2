// The CPU backend's vectorizable exp, GELU and SiLU (kernels/cpu/vector_math.h,
// through the backend's ApplyActivation and Sigmoid as it compiles them):
// accurate against double-precision libm, exact at the edges, and an
// element's bits the same wherever it sits in the array (vector body or
// scalar remainder of the loop). AddScaledRow, the weighted sum of expert
// outputs, rounds the product and the sum apart, as the reference does.
// NormRows takes its sums in the documented order (cpu_ops.cc), whichever
// build and group of rows computes a row.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/vector_math.h"

namespace switchserve::cpu {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

double GeluExact(double x) { return 0.5 * x * std::erfc(-x / std::sqrt(2.0)); }
double SiluExact(double x) { return x / (1.0 + std::exp(-x)); }

// Points over [lo, hi], plus every float near 0.
std::vector<float> Sweep(float lo, float hi, int n) {
  std::vector<float> x;
  for (int i = 0; i <= n; ++i) x.push_back(lo + (hi - lo) * static_cast<float>(i) / n);
  for (float v = 1e-30f; v < 1e-2f; v *= 3.7f) {
    x.push_back(v);
    x.push_back(-v);
  }
  x.push_back(0.0f);
  x.push_back(-0.0f);
  return x;
}

std::vector<float> Activated(Activation act, std::vector<float> x) {
  ApplyActivation(act, x.data(), static_cast<int64_t>(x.size()));
  return x;
}

// |got - want| within `relative` of want (and 1e-37 absolute, below which
// the tails end).
::testing::AssertionResult Close(float got, double want, double relative) {
  if (std::abs(got - want) <= relative * std::abs(want) + 1e-37) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << "got " << got << " want " << want;
}

TEST(CpuVectorMathTest, ExpWithinTwoUlpOverTheNormalRange) {
  for (float x : Sweep(-86.9f, 88.7f, 200001)) {
    const double want = std::exp(static_cast<double>(x));
    const float got = Exp(x);
    // An ulp of want: 2^(exponent - 23).
    const double ulp = std::ldexp(1.0, std::ilogb(want) - 23);
    ASSERT_LE(std::abs(got - want), 2 * ulp) << "x " << x << " got " << got << " want " << want;
  }
}

TEST(CpuVectorMathTest, ExpEdges) {
  EXPECT_EQ(Exp(0.0f), 1.0f);
  EXPECT_EQ(Exp(-kInf), 0.0f);
  EXPECT_EQ(Exp(-87.0f), 0.0f);  // below the normal range: 0, not a denormal
  EXPECT_EQ(Exp(kInf), kInf);
  EXPECT_EQ(Exp(89.0f), kInf);
  EXPECT_TRUE(std::isnan(Exp(kNaN)));
  EXPECT_GT(Exp(-86.9f), 0.0f);
  EXPECT_TRUE(std::isnormal(Exp(-86.9f)));
  EXPECT_TRUE(std::isfinite(Exp(88.7f)));
}

TEST(CpuVectorMathTest, GeluMatchesTheErfForm) {
  const std::vector<float> x = Sweep(-12.0f, 12.0f, 100001);
  const std::vector<float> y = Activated(Activation::kGelu, x);
  for (size_t i = 0; i < x.size(); ++i) {
    // 1.2e-7 from erfc's fit, the rest rounding; in the negative tail the
    // exponent -x^2 / 2, rounded to f32, adds up to 2e-7 x^2 (the erf form
    // in f32 lost everything there: 1 + erf(x / sqrt 2) cancels to 0 by -6).
    const double bound = 4e-7 + 2e-7 * static_cast<double>(x[i]) * x[i];
    ASSERT_TRUE(Close(y[i], GeluExact(x[i]), bound)) << "x " << x[i];
  }
  float edges[] = {kInf, 1e30f, -1e30f, -30.0f, kNaN};
  ApplyActivation(Activation::kGelu, edges, 5);
  EXPECT_EQ(edges[0], kInf);
  EXPECT_EQ(edges[1], 1e30f);
  EXPECT_EQ(edges[2], 0.0f);
  EXPECT_EQ(edges[3], 0.0f);
  EXPECT_TRUE(std::isnan(edges[4]));
}

TEST(CpuVectorMathTest, SiluAndSigmoidMatchDoublePrecision) {
  const std::vector<float> x = Sweep(-80.0f, 80.0f, 100001);
  const std::vector<float> y = Activated(Activation::kSilu, x);
  for (size_t i = 0; i < x.size(); ++i) {
    ASSERT_TRUE(Close(y[i], SiluExact(x[i]), 4e-7)) << "x " << x[i];
    const double sigmoid = 1.0 / (1.0 + std::exp(-static_cast<double>(x[i])));
    ASSERT_TRUE(Close(Sigmoid(x[i]), sigmoid, 4e-7)) << "x " << x[i];
  }
  EXPECT_EQ(Sigmoid(kInf), 1.0f);
  EXPECT_EQ(Sigmoid(-kInf), 0.0f);
  EXPECT_TRUE(std::isnan(Sigmoid(kNaN)));
}

// The loop runs vectors over the body and scalars over the rest: a value
// gets the same bits at every position, alone or among others.
TEST(CpuVectorMathTest, AnElementsBitsDoNotDependOnItsPosition) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (Activation act : {Activation::kGelu, Activation::kSilu}) {
    for (int n : {1, 3, 4, 5, 7, 8, 9, 31, 67}) {
      std::vector<float> x(n);
      for (float& v : x) v = normal(rng);
      std::vector<float> together = x;
      ApplyActivation(act, together.data(), n);
      for (int i = 0; i < n; ++i) {
        float alone = x[i];
        ApplyActivation(act, &alone, 1);
        ASSERT_EQ(std::bit_cast<uint32_t>(alone), std::bit_cast<uint32_t>(together[i]))
            << "n " << n << " position " << i << " x " << x[i];
      }
    }
  }
}

// row + weight * product with the product rounded before the add, as the
// reference does: a fused multiply-add would round once and give other bits
// for most of these elements.
TEST(CpuVectorMathTest, AddScaledRowRoundsTheProductThenTheSum) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> value(-3.0f, 3.0f);
  for (const int n : {1, 7, 16, 28, 33, 1024}) {
    std::vector<float> row(n), product(n);
    for (int i = 0; i < n; ++i) {
      row[i] = value(rng);
      product[i] = value(rng);
    }
    const float weight = value(rng);
    std::vector<float> expected(n);
    for (int i = 0; i < n; ++i) {
      volatile float scaled = weight * product[i];
      expected[i] = row[i] + scaled;
    }
    AddScaledRow(row.data(), product.data(), weight, n);
    for (int i = 0; i < n; ++i) {
      EXPECT_EQ(std::bit_cast<uint32_t>(row[i]), std::bit_cast<uint32_t>(expected[i]))
          << "n " << n << " element " << i;
    }
  }
}

// One row of NormRows written out: double sums with element i in partial
// i mod 4, the partials added (s0 + s1) + (s2 + s3); then each element
// ((x - mean) * inv) * weight, + bias, in float.
std::vector<float> NormRowByTheOrder(NormKind kind, float eps, const float* x, int d,
                                     const float* weight, const float* bias) {
  const auto sum = [&](double center, bool squares) {
    double part[4] = {};
    for (int i = 0; i < d; ++i) {
      double c = x[i];
      if (squares) {
        c -= center;
        c *= c;
      }
      part[i % 4] += c;
    }
    return (part[0] + part[1]) + (part[2] + part[3]);
  };
  const double mean = kind == NormKind::kLayerNorm ? sum(0.0, false) / d : 0.0;
  const float inv = static_cast<float>(1.0 / std::sqrt(sum(mean, true) / d + eps));
  const float m = static_cast<float>(mean);
  std::vector<float> out(d);
  for (int i = 0; i < d; ++i) {
    volatile float scaled = (x[i] - m) * inv;
    volatile float weighted = scaled * weight[i];
    out[i] = bias != nullptr ? weighted + bias[i] : weighted;
  }
  return out;
}

TEST(CpuVectorMathTest, NormRowsTakeTheirSumsInTheDocumentedOrder) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> value(-3.0f, 3.0f);
  // LayerNorm with and without a bias, RMSNorm.
  for (const auto& [kind, with_bias] :
       {std::pair{NormKind::kLayerNorm, true}, std::pair{NormKind::kLayerNorm, false},
        std::pair{NormKind::kRmsNorm, false}}) {
    // Rows in groups of four and alone; d with and without a tail of 1-3.
    for (const int rows : {1, 4, 7}) {
      for (const int d : {5, 112, 1023, 1024}) {
        std::vector<float> x(static_cast<size_t>(rows) * d), weight(d), bias(d);
        for (float& v : x) v = value(rng) + 0.5f;  // a mean for LayerNorm to take out
        for (float& v : weight) v = value(rng);
        for (float& v : bias) v = value(rng);
        if (rows > 1) {
          // Row 1 is zeros that end in [2^54, 1, -2^54, 1, 1] from a multiple
          // of 4: its sum is 0 in the documented order, 1 with the partials
          // added in sequence and 2 with the elements in sequence, and
          // without a bias the outputs show the mean.
          std::fill(x.data() + d, x.data() + 2 * d, 0.0f);
          const float big = std::ldexp(1.0f, 54);
          const float pattern[5] = {big, 1.0f, -big, 1.0f, 1.0f};
          std::copy(pattern, pattern + 5, x.data() + d + (d - 5) / 4 * 4);
        }
        const float* b = with_bias ? bias.data() : nullptr;
        std::vector<float> out(x.size());
        NormRows(kind, 1e-5f, x.data(), rows, d, weight.data(), b, out.data());
        for (int r = 0; r < rows; ++r) {
          const std::vector<float> want =
              NormRowByTheOrder(kind, 1e-5f, x.data() + r * d, d, weight.data(), b);
          for (int i = 0; i < d; ++i) {
            ASSERT_EQ(std::bit_cast<uint32_t>(out[r * d + i]), std::bit_cast<uint32_t>(want[i]))
                << (kind == NormKind::kLayerNorm ? "LayerNorm" : "RMSNorm") << " bias " << with_bias
                << " rows " << rows << " d " << d << " row " << r << " element " << i;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace switchserve::cpu
