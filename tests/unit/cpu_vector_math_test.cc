// The CPU backend's vectorizable exp, GELU and SiLU (kernels/cpu/vector_math.h,
// through the backend's ApplyActivation and Sigmoid as it compiles them):
// accurate against double-precision libm, exact at the edges, and an
// element's bits the same wherever it sits in the array (vector body or
// scalar remainder of the loop). AddScaledRow, the weighted sum of expert
// outputs, rounds the product and the sum apart, as the reference does.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
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

}  // namespace
}  // namespace switchserve::cpu
