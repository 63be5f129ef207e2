// The KV cache's element type (--kv-cache-dtype, BackendOptions::
// kv_cache_dtype): names, what each backend accepts, the bytes a token takes,
// and how far the CPU backend's bf16 cache moves logits from its f32 cache.
// Isolation with the bf16 cache is checked bitwise by the "Bf16KvCache"
// instances of batch_invariance_test.cc and isolation_test.cc.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "kernels/backends.h"
#include "kernels/cpu/cpu_backend.h"
#include "tests/util/backend_harness.h"
#include "tests/util/backends_under_test.h"
#include "tests/util/random_model.h"

namespace switchserve {
namespace {

TEST(KvCacheDtypeTest, NamesRoundTripAndOthersAreRefused) {
  for (KvCacheDtype dtype : {KvCacheDtype::kAuto, KvCacheDtype::kF32, KvCacheDtype::kBF16}) {
    absl::StatusOr<KvCacheDtype> parsed = ParseKvCacheDtype(ToString(dtype));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, dtype);
  }
  for (const char* text : {"fp8", "f16", "BF16", ""}) {
    absl::StatusOr<KvCacheDtype> parsed = ParseKvCacheDtype(text);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_TRUE(absl::StrContains(std::string(parsed.status().message()), "auto, f32 or bf16"));
  }
}

// Weights of the tiny SwitchAll shape whose matrices are held as `dtype`
// (routers and norms stay f32, as the loader keeps them).
ModelWeights TinyWeightsHeldAs(DType dtype) {
  ModelWeights weights = testing::RandomWeights(testing::TinySwitchAllConfig(), 1);
  for (LayerWeights& layer : weights.layers) {
    for (Tensor* t : {&layer.attn.q, &layer.attn.k, &layer.attn.v, &layer.attn.o}) {
      *t = t->ConvertedTo(dtype);
    }
  }
  return weights;
}

TEST(KvCacheDtypeTest, AutoFollowsTheWidthOfTheWeightMatrices) {
  const ModelWeights f32 = TinyWeightsHeldAs(DType::kF32);
  const ModelWeights bf16 = TinyWeightsHeldAs(DType::kBF16);
  const ModelWeights f16 = TinyWeightsHeldAs(DType::kF16);
  // The CPU backend computes from the matrices as loaded; f16 ones widen to
  // f32 exactly and keep the f32 cache.
  EXPECT_EQ(HeldKvCacheDtype(DeviceKind::kCpu, {}, f32), KvCacheDtype::kF32);
  EXPECT_EQ(HeldKvCacheDtype(DeviceKind::kCpu, {}, bf16), KvCacheDtype::kBF16);
  EXPECT_EQ(HeldKvCacheDtype(DeviceKind::kCpu, {}, f16), KvCacheDtype::kF32);
  // The CUDA backend holds them in 16 bits unless asked for f32.
  EXPECT_EQ(HeldKvCacheDtype(DeviceKind::kCuda, {}, f32), KvCacheDtype::kBF16);
  EXPECT_EQ(HeldKvCacheDtype(DeviceKind::kCuda, {.cuda_f32_weights = true}, bf16),
            KvCacheDtype::kF32);
  // A type asked for by name is what is held.
  EXPECT_EQ(HeldKvCacheDtype(DeviceKind::kCpu, {.kv_cache_dtype = KvCacheDtype::kBF16}, f32),
            KvCacheDtype::kBF16);
  EXPECT_EQ(HeldKvCacheDtype(DeviceKind::kCpu, {.kv_cache_dtype = KvCacheDtype::kF32}, bf16),
            KvCacheDtype::kF32);
  EXPECT_EQ(HeldKvCacheDtype(DeviceKind::kCuda, {.kv_cache_dtype = KvCacheDtype::kF32}, bf16),
            KvCacheDtype::kF32);
}

TEST(KvCacheDtypeTest, Bf16HalvesTheCpuCachesBytesPerToken) {
  const ModelConfig config = testing::TinySwitchAllConfig();
  const ModelWeights weights = testing::RandomWeights(config, 1);
  auto bytes = [&](KvCacheDtype dtype) {
    auto backend = CreateBackend(DeviceKind::kCpu, config, weights, config.dispatch,
                                 BackendOptions{.kv_cache_dtype = dtype});
    EXPECT_TRUE(backend.ok()) << backend.status();
    return backend.ok() ? (*backend)->KvBytesPerToken() : 0;
  };
  const int64_t f32 = bytes(KvCacheDtype::kF32);
  EXPECT_GT(f32, 0);
  EXPECT_EQ(bytes(KvCacheDtype::kAuto), f32);  // f32 matrices
  EXPECT_EQ(bytes(KvCacheDtype::kBF16) * 2, f32);
}

// What metrics and logs report (switchserve_model_info's kv_cache_dtype) is
// what the backend holds: kAuto resolved.
TEST(KvCacheDtypeTest, CpuBackendReportsTheTypeItHolds) {
  const ModelConfig config = testing::TinySwitchAllConfig();
  for (DType matrices : {DType::kF32, DType::kBF16}) {
    const ModelWeights weights = TinyWeightsHeldAs(matrices);
    for (const auto& [asked, held] :
         {std::pair{KvCacheDtype::kAuto, matrices}, std::pair{KvCacheDtype::kF32, DType::kF32},
          std::pair{KvCacheDtype::kBF16, DType::kBF16}}) {
      SCOPED_TRACE(std::string(ToString(matrices)) + " matrices, asked " +
                   std::string(ToString(asked)));
      auto backend = CreateBackend(DeviceKind::kCpu, config, weights, config.dispatch,
                                   BackendOptions{.kv_cache_dtype = asked});
      ASSERT_TRUE(backend.ok()) << backend.status();
      EXPECT_EQ((*backend)->kv_cache_dtype(), held);
    }
  }
}

#if defined(SWITCHSERVE_TEST_CUDA_BACKEND)
TEST(KvCacheDtypeTest, CudaBackendTakesOnlyTheTypeItsWeightsImply) {
  const ModelConfig config = testing::TinySwitchAllConfig();
  const ModelWeights weights = testing::RandomWeights(config, 1);
  auto create = [&](BackendOptions options) {
    return CreateBackend(DeviceKind::kCuda, config, weights, config.dispatch, options);
  };
  auto mismatched = create({.kv_cache_dtype = KvCacheDtype::kF32});
  EXPECT_EQ(mismatched.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(std::string(mismatched.status().message()),
                                "KV cache is bf16 with 16-bit weights"))
      << mismatched.status();
  EXPECT_EQ(
      create({.kv_cache_dtype = KvCacheDtype::kBF16, .cuda_f32_weights = true}).status().code(),
      absl::StatusCode::kInvalidArgument);
  for (const BackendOptions& options :
       {BackendOptions{}, BackendOptions{.kv_cache_dtype = KvCacheDtype::kBF16},
        BackendOptions{.kv_cache_dtype = KvCacheDtype::kF32, .cuda_f32_weights = true}}) {
    auto backend = create(options);
    if (!backend.ok() && backend.status().code() == absl::StatusCode::kFailedPrecondition) {
      continue;  // a GPU build on a machine without a usable GPU
    }
    ASSERT_TRUE(backend.ok()) << backend.status();
    EXPECT_EQ((*backend)->KvBytesPerToken(),
              KvBytesPerToken(config, options.cuda_f32_weights ? 4 : 2));
    EXPECT_EQ((*backend)->kv_cache_dtype(), options.cuda_f32_weights ? DType::kF32 : DType::kBF16);
  }
}
#endif

TEST(KvCacheDtypeTest, CpuBackendRefusesOtherElementTypes) {
  const ModelConfig config = testing::TinySwitchAllConfig();
  const ModelWeights weights = testing::RandomWeights(config, 1);
  CpuBackendOptions options;
  options.kv_cache_dtype = DType::kF16;
  auto backend = CreateCpuBackend(config, weights, config.dispatch, options);
  EXPECT_EQ(backend.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(std::string(backend.status().message()), "f32 or bf16"));
}

// Keys and values rounded to bf16 move a sequence's logits (so the cache does
// hold bf16), by a relative RMS under 1e-2 on every architecture variant:
// the bound the bf16 weights keep against f32 weights.
TEST(KvCacheDtypeTest, Bf16CacheLogitsStayCloseToTheF32Cache) {
  // "cpu_parallel": the same threads and sharing out, the cache in f32.
  const std::vector<testing::BackendUnderTest>& backends = testing::BackendsUnderTest();
  const auto f32_cache = std::find_if(backends.begin(), backends.end(), [](const auto& backend) {
    return backend.name == "cpu_parallel";
  });
  ASSERT_NE(f32_cache, backends.end());
  for (const testing::NamedConfig& variant : testing::AllVariantConfigs()) {
    SCOPED_TRACE(variant.name);
    const ModelConfig& config = variant.config;
    const ModelWeights weights = testing::RandomWeights(config, 23);
    const std::vector<int32_t> tokens = testing::RandomTokens(40, config.vocab_size, 3);
    testing::BackendHarness f32(*f32_cache, config, weights, config.dispatch);
    testing::BackendHarness bf16(testing::CpuBf16KvCacheBackend(), config, weights,
                                 config.dispatch);
    const std::vector<float> want = f32.Run(1, tokens, 0);
    const std::vector<float> got = bf16.Run(1, tokens, 0);
    ASSERT_EQ(want.size(), got.size());
    ASSERT_FALSE(want.empty());
    double diff = 0, norm = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      diff += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
      norm += static_cast<double>(want[i]) * want[i];
    }
    const double relative_rms = std::sqrt(diff / norm);
    EXPECT_GT(relative_rms, 0.0) << "the bf16 cache gave the f32 cache's bits";
    EXPECT_LT(relative_rms, 1e-2);
  }
}

}  // namespace
}  // namespace switchserve
