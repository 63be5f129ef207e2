// The CPU backend's matmul kernels (kernels/cpu/matmul.h): every output
// element follows the documented operation order, so a row's result is the
// same bits whatever rows, row order, columns, threads or k ranges surround it.
// Run for every kernel build this CPU supports, every weight dtype and both
// products, with weights row-major and tiled (rows-out in row blocks, rows-in
// in column panels: matmul.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_runner.h"

namespace switchserve::cpu {
namespace {

struct Shape {
  int m, n, k;
};

// Sizes that cross every tile edge of the kernels: register tiles of 4 rows x
// 3 weight rows or 3 vectors, vectors of 8, blocks of 64 rows, k not a
// multiple of 8, one to six rows against weight rows of 1 KiB and more
// (the rows-in kernel then takes 8 weight rows at a time across all columns),
// and many rows against k over 256 (the 16-lane rows-out tiles take k in
// blocks); one rows-in matrix over 512 KiB widened, which the AVX2
// kernels pack a panel at a time instead of whole; and 24 and 25 rows
// against k = 128 and rows over 64 columns, either side of the rows-in
// products whose bf16 weights are read in place, 64 columns at a time; and
// 70 rows against k = 600: the 16-lane rows-out tiles of more rows than 64
// carry their chains between blocks of k too.
const Shape kShapes[] = {
    {1, 1, 1},      {1, 13, 7},    {1, 72, 100},  {2, 5, 8},     {3, 24, 13},   {4, 31, 16},
    {5, 40, 33},    {7, 3, 257},   {9, 17, 64},   {64, 26, 24},  {65, 9, 130},  {70, 49, 41},
    {131, 8, 96},   {33, 72, 1},   {6, 200, 112}, {1, 300, 9},   {1, 523, 21},  {4, 300, 19},
    {6, 523, 21},   {20, 200, 37}, {13, 131, 29}, {8, 144, 8},   {1, 112, 40},  {20, 24, 601},
    {6, 139, 1001}, {24, 72, 128}, {25, 72, 128}, {24, 72, 129}, {70, 12, 600},
};

// The product, and for rows-out weights their layout.
enum class Layout { kRowsOut, kRowsOutTiled, kRowsIn, kRowsInTiled };

using Param = std::tuple<KernelIsa, DType, Layout>;

// Random values, with a few exact zeros and sign changes among them.
std::vector<float> RandomValues(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  for (size_t i = 0; i < n; i += 17) v[i] = 0.0f;
  return v;
}

// A random matrix, row-major or tiled.
class Weights {
 public:
  Weights(DType dtype, int rows, int cols, Tiling tiling, std::mt19937& rng)
      : tensor_(Tensor::F32({rows, cols}, RandomValues(static_cast<size_t>(rows) * cols, rng))
                    .ConvertedTo(dtype)),
        cols_(cols) {
    if (tiling != Tiling::kNone) tiled_ = TiledWeights(tensor_, tiling);
    matrix_ = tiling != Tiling::kNone ? tiled_.Matrix() : MatrixOf(tensor_, cols_);
  }
  WeightMatrix matrix() const { return matrix_; }
  float At(int r, int c) const { return tensor_.At(static_cast<int64_t>(r) * cols_ + c); }

 private:
  Tensor tensor_;
  TiledWeights tiled_;
  WeightMatrix matrix_;
  int cols_;
};

// matmul.h's documented order, one element at a time, in plain scalar code:
// with std::fma (exactly rounded) where the build fuses, else a multiply then
// an add.
float ReferenceElement(WeightLayout layout, bool fused, const float* a, const Weights& w, int j,
                       int k, float alpha, float c_before, bool accumulate) {
  if (layout == WeightLayout::kRowsOut) {
    float lane[8] = {};
    for (int p0 = 0; p0 < k; p0 += 8) {
      for (int l = 0; l < 8; ++l) {
        const int p = p0 + l;
        const float x = p < k ? a[p] : 0.0f, y = p < k ? w.At(j, p) : 0.0f;
        lane[l] = fused ? std::fma(x, y, lane[l]) : lane[l] + x * y;
      }
    }
    const float r = alpha * (((lane[0] + lane[4]) + (lane[1] + lane[5])) +
                             ((lane[2] + lane[6]) + (lane[3] + lane[7])));
    return accumulate ? c_before + r : r;
  }
  float acc = accumulate ? c_before : 0.0f;
  for (int p = 0; p < k; ++p) {
    acc = fused ? std::fma(a[p], w.At(p, j), acc) : acc + a[p] * w.At(p, j);
  }
  return acc;
}

class MatmulKernelTest : public ::testing::TestWithParam<Param> {
 protected:
  KernelIsa isa() const { return std::get<0>(GetParam()); }
  DType dtype() const { return std::get<1>(GetParam()); }
  WeightLayout layout() const {
    const Layout l = std::get<2>(GetParam());
    return l == Layout::kRowsIn || l == Layout::kRowsInTiled ? WeightLayout::kRowsIn
                                                             : WeightLayout::kRowsOut;
  }
  Tiling tiling() const {
    switch (std::get<2>(GetParam())) {
      case Layout::kRowsOutTiled:
        return Tiling::kRowBlocks;
      case Layout::kRowsInTiled:
        return Tiling::kColumnPanels;
      default:
        return Tiling::kNone;
    }
  }
  bool fused() const { return isa() != KernelIsa::kGeneric; }

  void Call(const MatmulArgs& args) const {
    const MatmulKernels& kernels = KernelsFor(isa());
    (layout() == WeightLayout::kRowsOut ? kernels.rows_out : kernels.rows_in)(args);
  }
  // Weights of shape [n, k] (rows out) or [k, n] (rows in).
  Weights MakeWeights(const Shape& s, std::mt19937& rng) const {
    return layout() == WeightLayout::kRowsOut ? Weights(dtype(), s.n, s.k, tiling(), rng)
                                              : Weights(dtype(), s.k, s.n, tiling(), rng);
  }
  // The weights of output columns [j0, ...).
  WeightMatrix Columns(const Weights& w, int j0) const {
    return layout() == WeightLayout::kRowsOut ? w.matrix().At(j0, 0) : w.matrix().At(0, j0);
  }
};

TEST_P(MatmulKernelTest, EveryElementFollowsTheDocumentedOrder) {
  std::mt19937 rng(1);
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "m " << s.m << " n " << s.n << " k " << s.k);
    const std::vector<float> a = RandomValues(static_cast<size_t>(s.m) * s.k, rng);
    const Weights w = MakeWeights(s, rng);
    for (bool accumulate : {false, true}) {
      const float alpha = layout() == WeightLayout::kRowsOut ? 0.37f : 1.0f;
      const std::vector<float> before = RandomValues(static_cast<size_t>(s.m) * s.n, rng);
      std::vector<float> c = before;
      MatmulArgs args{s.m, s.n, s.k, a.data(), s.k, nullptr, w.matrix(), c.data(), s.n};
      args.alpha = alpha;
      args.accumulate = accumulate;
      Call(args);
      int mismatches = 0;
      for (int i = 0; i < s.m; ++i) {
        for (int j = 0; j < s.n; ++j) {
          const float want = ReferenceElement(layout(), fused(), a.data() + i * s.k, w, j, s.k,
                                              alpha, before[i * s.n + j], accumulate);
          const float got = c[i * s.n + j];
          if (std::memcmp(&want, &got, sizeof(float)) != 0 && ++mismatches <= 3) {
            ADD_FAILURE() << "element (" << i << ", " << j << "): " << got << " != " << want
                          << (accumulate ? " (accumulating)" : "");
          }
        }
      }
      EXPECT_EQ(mismatches, 0);
    }
  }
}

TEST_P(MatmulKernelTest, CloseToDoublePrecision) {
  std::mt19937 rng(2);
  for (const Shape& s : kShapes) {
    const std::vector<float> a = RandomValues(static_cast<size_t>(s.m) * s.k, rng);
    const Weights w = MakeWeights(s, rng);
    std::vector<float> c(static_cast<size_t>(s.m) * s.n, NAN);
    Call({s.m, s.n, s.k, a.data(), s.k, nullptr, w.matrix(), c.data(), s.n});
    for (int i = 0; i < s.m; ++i) {
      for (int j = 0; j < s.n; ++j) {
        double want = 0, scale = 0;
        for (int p = 0; p < s.k; ++p) {
          const double wv = layout() == WeightLayout::kRowsOut ? w.At(j, p) : w.At(p, j);
          want += static_cast<double>(a[i * s.k + p]) * wv;
          scale += std::abs(static_cast<double>(a[i * s.k + p]) * wv);
        }
        // |error| <= k u sum |a w| (u = 2^-24) for any summation order.
        ASSERT_NEAR(c[i * s.n + j], want, (s.k + 2) * 6e-8 * scale + 1e-30)
            << "m " << s.m << " n " << s.n << " k " << s.k << " element " << i << ", " << j;
      }
    }
  }
}

// The heart of batch invariance: a row computed with any other rows, at any
// place, in any column range, gives the same bits.
TEST_P(MatmulKernelTest, RowResultIndependentOfBatchPlaceAndColumns) {
  std::mt19937 rng(3);
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "m " << s.m << " n " << s.n << " k " << s.k);
    const std::vector<float> a = RandomValues(static_cast<size_t>(s.m) * s.k, rng);
    const Weights w = MakeWeights(s, rng);
    std::vector<float> full(static_cast<size_t>(s.m) * s.n);
    Call({s.m, s.n, s.k, a.data(), s.k, nullptr, w.matrix(), full.data(), s.n});

    // Rows in consecutive batches of random sizes.
    std::vector<float> pieces(full.size(), NAN);
    for (int i0 = 0; i0 < s.m;) {
      const int rows = std::min(s.m - i0, 1 + static_cast<int>(rng() % 9));
      Call({rows, s.n, s.k, a.data() + i0 * s.k, s.k, nullptr, w.matrix(), pieces.data() + i0 * s.n,
            s.n});
      i0 += rows;
    }
    EXPECT_EQ(0, std::memcmp(pieces.data(), full.data(), full.size() * sizeof(float)))
        << "rows computed in smaller batches differ";

    // Rows in a random order through a_rows, each landing at its place.
    std::vector<int32_t> order(s.m);
    for (int i = 0; i < s.m; ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<float> shuffled(full.size(), NAN);
    Call({s.m, s.n, s.k, a.data(), s.k, order.data(), w.matrix(), shuffled.data(), s.n});
    for (int i = 0; i < s.m; ++i) {
      EXPECT_EQ(0, std::memcmp(shuffled.data() + i * s.n, full.data() + order[i] * s.n,
                               s.n * sizeof(float)))
          << "row " << order[i] << " read through a_rows at place " << i;
    }

    // Each row alone, in column ranges of random widths.
    std::vector<float> alone(full.size(), NAN);
    for (int i = 0; i < s.m; ++i) {
      for (int j0 = 0; j0 < s.n;) {
        const int cols = std::min(s.n - j0, 1 + static_cast<int>(rng() % 20));
        Call({1, cols, s.k, a.data() + i * s.k, s.k, nullptr, Columns(w, j0),
              alone.data() + i * s.n + j0, s.n});
        j0 += cols;
      }
    }
    EXPECT_EQ(0, std::memcmp(alone.data(), full.data(), full.size() * sizeof(float)))
        << "rows computed alone in column ranges differ";
  }
}

// The rows-in contract (matmul.h): the builds and dtypes of AllBuilds, in
// the rows-in layouts only.
class RowsInKernelTest : public MatmulKernelTest {};

TEST_P(RowsInKernelTest, AccumulatingOverKRangesEqualsOneCall) {
  ASSERT_EQ(layout(), WeightLayout::kRowsIn);
  std::mt19937 rng(4);
  for (const Shape& s : kShapes) {
    if (s.k < 2) continue;
    const std::vector<float> a = RandomValues(static_cast<size_t>(s.m) * s.k, rng);
    const Weights w = MakeWeights(s, rng);
    std::vector<float> whole(static_cast<size_t>(s.m) * s.n);
    Call({s.m, s.n, s.k, a.data(), s.k, nullptr, w.matrix(), whole.data(), s.n});
    std::vector<float> split(whole.size(), NAN);
    for (int p0 = 0; p0 < s.k;) {
      const int len = std::min(s.k - p0, 1 + static_cast<int>(rng() % 40));
      MatmulArgs args{s.m,          s.n, len, a.data() + p0, s.k, nullptr, w.matrix().At(p0, 0),
                      split.data(), s.n};
      args.accumulate = p0 > 0;
      Call(args);
      p0 += len;
    }
    EXPECT_EQ(0, std::memcmp(split.data(), whole.data(), whole.size() * sizeof(float)))
        << "m " << s.m << " n " << s.n << " k " << s.k;
  }
}

// MatmulArgs::c_scale: each row's product, from 0, added to the row of c that
// c_rows names times its gate, one multiply and one add, as AddScaledRow adds
// it; the other rows of c untouched.
TEST_P(MatmulKernelTest, ScaledRowsAddTheProductTimesTheirGateToTheirRows) {
  std::mt19937 rng(6);
  const float alpha = layout() == WeightLayout::kRowsOut ? 0.37f : 1.0f;
  for (const Shape& s : kShapes) {
    SCOPED_TRACE(::testing::Message() << "m " << s.m << " n " << s.n << " k " << s.k);
    const std::vector<float> a = RandomValues(static_cast<size_t>(s.m) * s.k, rng);
    const Weights w = MakeWeights(s, rng);
    // Rows of c two apart, from the last down, among rows nobody adds to.
    const int c_rows_total = 2 * s.m + 3;
    std::vector<int32_t> rows(s.m);
    for (int i = 0; i < s.m; ++i) rows[i] = 2 * (s.m - 1 - i) + 1;
    const std::vector<float> scale = RandomValues(s.m, rng);
    const std::vector<float> before = RandomValues(static_cast<size_t>(c_rows_total) * s.n, rng);
    std::vector<float> c = before;
    MatmulArgs args{s.m, s.n, s.k, a.data(), s.k, nullptr, w.matrix(), c.data(), s.n};
    args.alpha = alpha;
    args.accumulate = true;  // unused with c_scale
    args.c_rows = rows.data();
    args.c_scale = scale.data();
    Call(args);
    std::vector<float> want = before;
    for (int i = 0; i < s.m; ++i) {
      for (int j = 0; j < s.n; ++j) {
        const float product = ReferenceElement(layout(), fused(), a.data() + i * s.k, w, j, s.k,
                                               alpha, 0.0f, /*accumulate=*/false);
        const float scaled = scale[i] * product;
        float& out = want[static_cast<size_t>(rows[i]) * s.n + j];
        out = out + scaled;
      }
    }
    EXPECT_EQ(0, std::memcmp(c.data(), want.data(), want.size() * sizeof(float)));
  }
}

// The runner splits a group of products across threads; no element changes.
TEST_P(MatmulKernelTest, RunnerThreadsChangeNoBits) {
  std::mt19937 rng(5);
  std::vector<std::vector<float>> inputs;
  std::vector<Weights> weights;
  std::vector<MatmulTask> tasks;
  std::vector<std::vector<float>> serial_out, parallel_out;
  for (const Shape& s : kShapes) {
    inputs.push_back(RandomValues(static_cast<size_t>(s.m) * s.k, rng));
    weights.push_back(MakeWeights(s, rng));
    serial_out.emplace_back(static_cast<size_t>(s.m) * s.n, NAN);
    parallel_out.emplace_back(static_cast<size_t>(s.m) * s.n, NAN);
  }
  auto run = [&](int threads, std::vector<std::vector<float>>& out) {
    tasks.clear();
    for (size_t t = 0; t < std::size(kShapes); ++t) {
      const Shape& s = kShapes[t];
      tasks.push_back({layout(),
                       {s.m, s.n, s.k, inputs[t].data(), s.k, nullptr, weights[t].matrix(),
                        out[t].data(), s.n}});
    }
    WorkerPool pool(threads);
    MatmulRunner runner(isa(), &pool, /*parallel_min_macs=*/0);
    runner.Run(tasks);
  };
  run(1, serial_out);
  run(2, parallel_out);
  for (size_t t = 0; t < std::size(kShapes); ++t) {
    EXPECT_EQ(0, std::memcmp(serial_out[t].data(), parallel_out[t].data(),
                             serial_out[t].size() * sizeof(float)))
        << "task " << t;
  }
}

// A task's epilogue (bias, then activation) gives the bits of AddBiasRows and
// ApplyActivation over the whole output after the product, however the runner
// cuts the task into pieces.
TEST_P(MatmulKernelTest, RunnerEpilogueEqualsBiasAndActivationAfterTheProduct) {
  std::mt19937 rng(6);
  for (const Shape& s : kShapes) {
    const std::vector<float> a = RandomValues(static_cast<size_t>(s.m) * s.k, rng);
    const std::vector<float> bias = RandomValues(static_cast<size_t>(s.n), rng);
    const Weights w = MakeWeights(s, rng);
    const MatmulArgs args{s.m, s.n, s.k, a.data(), s.k, nullptr, w.matrix(), nullptr, s.n};
    for (const Activation act : {Activation::kRelu, Activation::kGelu, Activation::kSilu}) {
      std::vector<float> expected(static_cast<size_t>(s.m) * s.n, NAN);
      MatmulArgs plain = args;
      plain.c = expected.data();
      Call(plain);
      AddBiasRows(expected.data(), s.m, s.n, s.n, bias.data());
      ApplyActivation(act, expected.data(), static_cast<int64_t>(expected.size()));
      for (const int threads : {1, 2}) {
        std::vector<float> fused(expected.size(), NAN);
        MatmulArgs into = args;
        into.c = fused.data();
        WorkerPool pool(threads);
        MatmulRunner runner(isa(), &pool, /*parallel_min_macs=*/0);
        runner.Run(layout(), into, {bias.data(), act});
        EXPECT_EQ(0, std::memcmp(fused.data(), expected.data(), expected.size() * sizeof(float)))
            << "m " << s.m << " n " << s.n << " k " << s.k << " threads " << threads
            << " activation " << static_cast<int>(act);
      }
    }
  }
}

// RunPairs (each pair's second product reads its first's output: an
// expert's up and down projections) gives the bits of each product run alone,
// first products then second, whether the pairs are taken whole on two
// threads (a few rows each, two pairs or more per thread) or each half is
// shared out on its own (many rows).
TEST_P(MatmulKernelTest, RunPairsEqualsEachProductAlone) {
  std::mt19937 rng(8);
  const int k = 70, hidden = 40, n = 52;
  for (const int rows : {1, 3, 9, 100}) {
    constexpr int kPairs = 6;
    const std::vector<float> a = RandomValues(static_cast<size_t>(kPairs) * rows * k, rng);
    const std::vector<float> bias = RandomValues(static_cast<size_t>(kPairs) * hidden, rng);
    std::vector<Weights> up, down;
    for (int i = 0; i < kPairs; ++i) {
      up.push_back(MakeWeights({rows, hidden, k}, rng));
      down.push_back(MakeWeights({rows, n, hidden}, rng));
    }
    // Outputs start as NaN: a second product that ran before its first
    // would read NaN.
    auto run = [&](int threads, bool pairs, std::vector<float>& h, std::vector<float>& out) {
      h.assign(static_cast<size_t>(kPairs) * rows * hidden, NAN);
      out.assign(static_cast<size_t>(kPairs) * rows * n, NAN);
      std::vector<MatmulTask> first, second;
      for (int i = 0; i < kPairs; ++i) {
        float* hi = h.data() + static_cast<size_t>(i) * rows * hidden;
        first.push_back({layout(),
                         {rows, hidden, k, a.data() + static_cast<size_t>(i) * rows * k, k, nullptr,
                          up[i].matrix(), hi, hidden},
                         {bias.data() + i * hidden, Activation::kGelu}});
        second.push_back({layout(),
                          {rows, n, hidden, hi, hidden, nullptr, down[i].matrix(),
                           out.data() + static_cast<size_t>(i) * rows * n, n}});
      }
      WorkerPool pool(threads);
      MatmulRunner runner(isa(), &pool, /*parallel_min_macs=*/0);
      if (pairs) {
        runner.RunPairs(first, second);
      } else {
        runner.Run(first);
        runner.Run(second);
      }
    };
    std::vector<float> h_alone, out_alone, h_pairs, out_pairs;
    run(1, false, h_alone, out_alone);
    run(2, true, h_pairs, out_pairs);
    EXPECT_EQ(0, std::memcmp(h_pairs.data(), h_alone.data(), h_alone.size() * sizeof(float)))
        << "rows " << rows;
    EXPECT_EQ(0, std::memcmp(out_pairs.data(), out_alone.data(), out_alone.size() * sizeof(float)))
        << "rows " << rows;
  }
}

std::string ParamName(const ::testing::TestParamInfo<Param>& info) {
  const auto [isa, dtype, layout] = info.param;
  return std::string(ToString(isa)) + "_" + std::string(ToString(dtype)) +
         (layout == Layout::kRowsOut        ? "_rows_out"
          : layout == Layout::kRowsOutTiled ? "_rows_out_tiled"
          : layout == Layout::kRowsIn       ? "_rows_in"
                                            : "_rows_in_tiled");
}

INSTANTIATE_TEST_SUITE_P(
    AllBuilds, MatmulKernelTest,
    ::testing::Combine(::testing::ValuesIn(SupportedKernelIsas()),
                       ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                       ::testing::Values(Layout::kRowsOut, Layout::kRowsOutTiled, Layout::kRowsIn,
                                         Layout::kRowsInTiled)),
    ParamName);

INSTANTIATE_TEST_SUITE_P(
    RowsInBuilds, RowsInKernelTest,
    ::testing::Combine(::testing::ValuesIn(SupportedKernelIsas()),
                       ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                       ::testing::Values(Layout::kRowsIn, Layout::kRowsInTiled)),
    ParamName);

TEST(KernelIsaTest, BestIsSupportedAndTheWidestTheCpuHas) {
  EXPECT_TRUE(CpuSupports(BestKernelIsa()));
  EXPECT_TRUE(CpuSupports(KernelIsa::kGeneric));
  if (CpuSupports(KernelIsa::kAvx512)) {
    EXPECT_EQ(BestKernelIsa(), KernelIsa::kAvx512);
  } else if (CpuSupports(KernelIsa::kAvx2)) {
    EXPECT_EQ(BestKernelIsa(), KernelIsa::kAvx2);
  }
}

}  // namespace
}  // namespace switchserve::cpu
