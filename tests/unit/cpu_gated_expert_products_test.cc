// GatedExpertProducts (kernels/cpu/gated_expert_products.h) adds each
// expert's product rows into its tokens' rows a block of columns and tokens
// at a time. Its results must be the bits of the whole products
// (MatmulRunner) followed by AddExpertOutputs, for every kernel build, weight
// dtype and layout, on one thread and on two, whether the products are
// taken whole (a few rows per expert) or by blocks, the tokens in one
// block or many, and whether an expert's slots list its tokens in order
// or not (step-scope dispatch lists them rank by rank).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "engine/model/model_weights.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/gated_expert_products.h"
#include "kernels/cpu/matmul_runner.h"
#include "kernels/cpu/worker_pool.h"

namespace switchserve::cpu {
namespace {

std::vector<float> RandomValues(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// Each token picks `top_k` distinct experts of `experts` (a few tokens none:
// all dropped), slots filled rank by rank, so that an expert's tokens run in
// increasing order once per rank.
ExpertAssignments RandomAssignments(int tokens, int experts, int top_k, std::mt19937& rng) {
  std::vector<std::vector<int>> choices(tokens);
  std::uniform_real_distribution<float> gate(0.05f, 1.0f);
  for (int t = 0; t < tokens; ++t) {
    if (t % 11 == 5) continue;
    std::vector<int> order(experts);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    choices[t].assign(order.begin(), order.begin() + top_k);
  }
  ExpertAssignments as;
  as.n_experts = experts;
  as.offsets.assign(experts + 1, 0);
  for (int e = 0; e < experts; ++e) {
    as.offsets[e + 1] = as.offsets[e];
    for (int r = 0; r < top_k; ++r) {
      for (int t = 0; t < tokens; ++t) {
        if (!choices[t].empty() && choices[t][r] == e) {
          as.token.push_back(t);
          as.weight.push_back(gate(rng));
          ++as.offsets[e + 1];
        }
      }
    }
  }
  return as;
}

struct Case {
  int tokens, n, k;
};

using Param = std::tuple<KernelIsa, DType, WeightLayout, int>;

class GatedExpertProductsTest : public ::testing::TestWithParam<Param> {};

// Rows-in tasks read a's rows by token (as the output experts read the
// attention outputs), rows-out tasks read them by slot (as an FFN's down
// projections would read its hidden rows). Groups 0 and 1 share their
// assignments (a shared router), group 2 has its own.
TEST_P(GatedExpertProductsTest, AddsTheBitsOfWholeProductsThenAddExpertOutputs) {
  const auto [isa, dtype, layout, threads] = GetParam();
  const bool rows_in = layout == WeightLayout::kRowsIn;
  // Blocks of columns, one token block; several token blocks (5000 tokens
  // over one column step); a few rows per expert (decode), which take the
  // products whole, groups sharing assignments included.
  const Case cases[] = {{100, 200, 40}, {5000, 40, 16}, {24, 1100, 19}};
  constexpr int kGroups = 3, kExperts = 4, kTopK = 2;
  std::mt19937 rng(7);
  for (const Case& c : cases) {
    SCOPED_TRACE("tokens " + std::to_string(c.tokens) + ", n " + std::to_string(c.n));
    std::vector<ExpertAssignments> assignments;
    assignments.push_back(RandomAssignments(c.tokens, kExperts, kTopK, rng));
    assignments.push_back(RandomAssignments(c.tokens, kExperts, kTopK, rng));
    const ExpertAssignments* group_assignments[kGroups] = {&assignments[0], &assignments[0],
                                                           &assignments[1]};
    const int64_t matrix = static_cast<int64_t>(c.n) * c.k;
    const Tensor weights =
        Tensor::F32({kGroups * kExperts * matrix}, RandomValues(kGroups * kExperts * matrix, rng))
            .ConvertedTo(dtype);
    // By token: [tokens, groups * k]; by slot: each group's slots, [slots, k].
    int64_t a_rows = rows_in ? c.tokens : 0;
    for (int g = 0; g < kGroups && !rows_in; ++g) a_rows += group_assignments[g]->offsets.back();
    const std::vector<float> a =
        RandomValues(static_cast<size_t>(a_rows) * (rows_in ? kGroups : 1) * c.k, rng);
    const std::vector<float> dst_before = RandomValues(static_cast<size_t>(c.tokens) * c.n, rng);

    WorkerPool pool(threads);
    MatmulRunner runner(isa, &pool, /*parallel_min_macs=*/0);
    std::vector<MatmulTask> products;
    std::vector<GatedExpertTask> gated;
    std::vector<float> product;
    int64_t slot_base = 0;
    int64_t total_slots = 0;
    for (int g = 0; g < kGroups; ++g) total_slots += group_assignments[g]->offsets.back();
    product.resize(static_cast<size_t>(total_slots) * c.n);
    std::vector<ExpertOutputs> outputs;
    for (int g = 0; g < kGroups; ++g) {
      const ExpertAssignments& as = *group_assignments[g];
      for (int e = 0; e < kExperts; ++e) {
        if (as.count(e) == 0) continue;
        MatmulArgs args;
        args.m = as.count(e);
        args.n = c.n;
        args.k = c.k;
        if (rows_in) {
          args.a = a.data() + static_cast<int64_t>(g) * c.k;
          args.lda = static_cast<int64_t>(kGroups) * c.k;
          args.a_rows = as.token.data() + as.begin(e);
        } else {
          args.a = a.data() + (slot_base + as.begin(e)) * c.k;
          args.lda = c.k;
        }
        args.w = MatrixOf(weights, rows_in ? c.n : c.k, (g * kExperts + e) * matrix);
        gated.push_back({{layout, args}, &as, e});
        args.c = product.data() + (slot_base + as.begin(e)) * c.n;
        args.ldc = c.n;
        products.push_back({layout, args});
      }
      outputs.push_back({&as, product.data() + slot_base * c.n, nullptr, c.n});
      slot_base += as.offsets.back();
    }

    // The whole products, then AddExpertOutputs.
    std::vector<float> expected = dst_before;
    runner.Run(products);
    for (ExpertOutputs& group : outputs) group.dst = expected.data();
    AddExpertOutputs(outputs, c.n, c.tokens, &pool, /*parallel_min_values=*/0);

    std::vector<float> got = dst_before;
    GatedExpertProducts fused(&runner, &pool);
    fused.Run(gated, c.n, c.tokens, got.data(), c.n);
    EXPECT_EQ(0, std::memcmp(expected.data(), got.data(), got.size() * sizeof(float)));
    // The products changed the rows: the comparison is not of two untouched
    // copies.
    EXPECT_NE(0, std::memcmp(dst_before.data(), got.data(), got.size() * sizeof(float)));
  }
}

std::string ParamName(const ::testing::TestParamInfo<Param>& info) {
  const auto [isa, dtype, layout, threads] = info.param;
  return std::string(ToString(isa)) + "_" + std::string(ToString(dtype)) +
         (layout == WeightLayout::kRowsOut ? "_rows_out_" : "_rows_in_") + std::to_string(threads) +
         "_threads";
}

INSTANTIATE_TEST_SUITE_P(
    AllBuilds, GatedExpertProductsTest,
    ::testing::Combine(::testing::ValuesIn(SupportedKernelIsas()),
                       ::testing::Values(DType::kF32, DType::kBF16, DType::kF16),
                       ::testing::Values(WeightLayout::kRowsOut, WeightLayout::kRowsIn),
                       ::testing::Values(1, 2)),
    ParamName);

}  // namespace
}  // namespace switchserve::cpu
