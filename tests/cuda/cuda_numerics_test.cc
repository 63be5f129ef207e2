// The CUDA backend's numerics against the CPU backend's (f32) on the golden
// models:
//   - the 16-bit weight format keeps each matrix in the 16-bit type that
//     holds it exactly (bf16, or f16 for an f16 checkpoint; f32 values
//     rounded to bf16);
//   - free-running on the 16-bit checkpoints (switchall_bf16, switchall_f16):
//     relative RMS <= 1e-2 and the same argmax where the CPU's top two
//     logits are more than 0.1 apart;
//   - routing replay on every golden model: the CUDA backend forced to the
//     CPU's routing decisions (so that a near tie flipped by rounding cannot
//     change a token's experts) gives logits within 1e-3 of the largest
//     (f32 weights), or within the 16-bit bounds above on the model's
//     matrices rounded to bf16 (16-bit weights).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/model/model_loader.h"
#include "engine/runtime/kv_cache.h"
#include "gtest/gtest.h"
#include "kernels/cuda/device_weights.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/util/backend_harness.h"
#include "tests/util/golden.h"
#include "tests/util/random_model.h"

namespace switchserve {
namespace {

// The golden step (all sequences, every row's logits and routing) on `backend`.
StepOutput GoldenStep(const testing::BackendUnderTest& backend, const Model& model,
                      const testing::GoldenCase& golden) {
  std::unique_ptr<Backend> b = backend.create(model.config, model.weights, model.config.dispatch);
  KvCacheOptions options;
  options.block_size = 16;
  options.max_tokens = 64 * 16;
  auto cache = KvCache::Create(b.get(), options);
  EXPECT_TRUE(cache.ok()) << cache.status();
  StepBatch batch;
  batch.Clear(16);
  for (size_t s = 0; s < golden.sequences.size(); ++s) {
    EXPECT_TRUE((*cache)->allocator().Reserve(s, golden.sequences[s].size()).ok());
    StepSequence& sequence = batch.Add(golden.sequences[s], 0, (*cache)->allocator().BlockTable(s));
    sequence.logits = LogitsMode::kAll;
    sequence.collect_routing = true;
  }
  StepOutput out;
  EXPECT_TRUE(b->Forward(batch, &out).ok());
  return out;
}

// Rounds the tensors the 16-bit format stores in 16 bits (not routers, norms,
// biases) to bf16, unless they are f16 numbers already.
void RoundMatricesToBf16(const ModelConfig& config, ModelWeights* weights) {
  auto round = [](Tensor& t) {
    if (t.dtype() != DType::kF32) return;  // held in 16 bits as stored
    bool f16 = true;
    for (float v : std::span<const float>(t.f32(), t.size()))
      f16 = f16 && __half2float(__float2half_rn(v)) == v;
    if (f16) return;
    for (float& v : std::span<float>(t.mutable_f32(), t.size()))
      v = __bfloat162float(__float2bfloat16_rn(v));
  };
  round(weights->embedding);
  round(weights->lm_head);
  for (int l = 0; l < config.n_layers; ++l) {
    LayerWeights& layer = weights->layers[l];
    for (Tensor* t : {&layer.attn.q, &layer.attn.k, &layer.attn.v, &layer.attn.o, &layer.ffn.w1,
                      &layer.ffn.w2}) {
      round(*t);
    }
  }
}

void ExpectWithin16BitBounds(const std::vector<float>& cuda, const std::vector<float>& cpu,
                             int vocab) {
  ASSERT_EQ(cuda.size(), cpu.size());
  EXPECT_LE(testing::RelativeRms(cuda, cpu), 1e-2);
  for (size_t row = 0; row < cpu.size() / vocab; ++row) {
    const float* c = cpu.data() + row * vocab;
    std::vector<float> sorted(c, c + vocab);
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
    if (sorted[0] - sorted[1] <= 0.1f) continue;
    const float* g = cuda.data() + row * vocab;
    EXPECT_EQ(std::max_element(g, g + vocab) - g, std::max_element(c, c + vocab) - c)
        << "row " << row;
  }
}

class CudaNumericsTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto golden = testing::LoadGolden(GetParam());
    ASSERT_TRUE(golden.ok()) << golden.status();
    golden_ = *std::move(golden);
    auto model = LoadModel(golden_.model_dir);
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = *std::move(model);
  }
  testing::GoldenCase golden_;
  std::unique_ptr<Model> model_;
};

TEST_P(CudaNumericsTest, ReplayingTheCpusRoutingGivesItsLogits) {
  for (const bool sixteen_bit : {false, true}) {
    SCOPED_TRACE(sixteen_bit ? "16-bit weights" : "f32 weights");
    if (sixteen_bit) RoundMatricesToBf16(model_->config, &model_->weights);
    const StepOutput cpu = GoldenStep(testing::CpuBackend(), *model_, golden_);
    CudaBackendOptions options =
        sixteen_bit ? testing::Cuda16BitOptions() : testing::CudaF32Options();
    options.forced_routing = &cpu.routing;
    const StepOutput cuda = GoldenStep(testing::CudaBackendWith(options, "cuda"), *model_, golden_);
    if (sixteen_bit) {
      ExpectWithin16BitBounds(cuda.logits, cpu.logits, model_->config.vocab_size);
    } else {
      EXPECT_LE(testing::RelError(cuda.logits, cpu.logits), 1e-3);
    }
    ASSERT_EQ(cuda.routing.size(), cpu.routing.size());
    for (size_t t = 0; t < cpu.routing.size(); ++t) {
      for (size_t i = 0; i < cpu.routing[t].choices.size(); ++i) {
        EXPECT_EQ(cuda.routing[t].choices[i].expert, cpu.routing[t].choices[i].expert);
        EXPECT_EQ(cuda.routing[t].choices[i].fate, cpu.routing[t].choices[i].fate);
      }
    }
    for (size_t r = 0; r < cpu.stats.routers.size(); ++r) {
      EXPECT_EQ(cuda.stats.routers[r].kept, cpu.stats.routers[r].kept) << "router " << r;
      EXPECT_EQ(cuda.stats.routers[r].dropped, cpu.stats.routers[r].dropped) << "router " << r;
    }
  }
}

TEST(CudaSixteenBitTest, SixteenBitCheckpointsRunFreeWithinBounds) {
  for (const char* variant : {"switchall_bf16", "switchall_f16"}) {
    SCOPED_TRACE(variant);
    auto golden = testing::LoadGolden(variant);
    ASSERT_TRUE(golden.ok()) << golden.status();
    auto model = LoadModel(golden->model_dir);
    ASSERT_TRUE(model.ok()) << model.status();
    const StepOutput cpu = GoldenStep(testing::CpuBackend(), **model, *golden);
    const StepOutput cuda =
        GoldenStep(testing::CudaBackendWith(testing::Cuda16BitOptions(), "cuda"), **model, *golden);
    ExpectWithin16BitBounds(cuda.logits, cpu.logits, (*model)->config.vocab_size);
  }
}

INSTANTIATE_TEST_SUITE_P(Goldens, CudaNumericsTest,
                         ::testing::ValuesIn(testing::ListGoldenVariants()),
                         [](const ::testing::TestParamInfo<std::string>& param) {
                           return param.param;
                         });

// What DeviceWeights keeps, read back from the device.
struct Kept {
  cuda::WeightType type;
  std::vector<float> values;
};

Kept Upload(const std::vector<float>& values, cuda::WeightFormat format,
            bool allow_non_finite_weights = false) {
  ModelConfig config = testing::DenseMhaConfig();
  ModelWeights weights = testing::RandomWeights(config, 1);
  // The whole tensor decides its type: repeat the values over it.
  for (size_t i = 0; i < static_cast<size_t>(weights.embedding.size()); ++i) {
    weights.embedding.mutable_f32()[i] = values[i % values.size()];
  }
  auto uploaded = cuda::DeviceWeights::Upload(config, weights, format, allow_non_finite_weights);
  EXPECT_TRUE(uploaded.ok()) << uploaded.status();
  if (!uploaded.ok()) return Kept{};
  const cuda::DeviceMatrix& m = (*uploaded)->embedding();
  const size_t n = static_cast<size_t>(weights.embedding.size());
  Kept kept{m.type, std::vector<float>(n)};
  if (m.type == cuda::WeightType::kF32) {
    EXPECT_EQ(cudaMemcpy(kept.values.data(), m.data, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  } else {
    if (m.type == cuda::WeightType::kBf16) {
      std::vector<__nv_bfloat16> raw(n);
      EXPECT_EQ(cudaMemcpy(raw.data(), m.data, n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
      for (size_t i = 0; i < n; ++i) kept.values[i] = __bfloat162float(raw[i]);
    } else {
      std::vector<__half> raw(n);
      EXPECT_EQ(cudaMemcpy(raw.data(), m.data, n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
      for (size_t i = 0; i < n; ++i) kept.values[i] = __half2float(raw[i]);
    }
  }
  kept.values.resize(values.size());
  return kept;
}

TEST(CudaWeightsTest, SixteenBitTypeHoldsTheCheckpointExactly) {
  // 1 + 2^-10 is an f16 number but not a bf16 one; 1 + 2^-7 and 2^20 are both
  // bf16 numbers; 1 + 2^-12 is neither.
  const std::vector<float> f16 = {1.0f + 0x1p-10f, -0.5f, 3.0f};
  Kept kept = Upload(f16, cuda::WeightFormat::k16Bit);
  EXPECT_EQ(kept.type, cuda::WeightType::kF16);
  EXPECT_EQ(kept.values, f16);

  const std::vector<float> bf16 = {1.0f + 0x1p-7f, 0x1p20f, -2.0f};
  kept = Upload(bf16, cuda::WeightFormat::k16Bit);
  EXPECT_EQ(kept.type, cuda::WeightType::kBf16);
  EXPECT_EQ(kept.values, bf16);

  const std::vector<float> f32 = {1.0f + 0x1p-12f, 0.1f, 3.0f};
  kept = Upload(f32, cuda::WeightFormat::k16Bit);
  EXPECT_EQ(kept.type, cuda::WeightType::kBf16);
  EXPECT_EQ(kept.values[0], 1.0f);  // rounded to nearest even
  EXPECT_EQ(kept.values[2], 3.0f);

  kept = Upload(f32, cuda::WeightFormat::kFloat32);
  EXPECT_EQ(kept.type, cuda::WeightType::kF32);
  EXPECT_EQ(kept.values, f32);
}

// A finite f32 value beyond bf16's largest finite number (0x1.fep127,
// about 3.39e38) would become infinite once the 16-bit format rounds it to
// bf16: the upload is refused, naming the tensor and the element, as the
// loader refuses one narrowed by --weights-dtype. f32 holds it; bf16's
// largest number itself is kept.
TEST(CudaWeightsTest, FiniteValuesBeyondBf16sRangeAreRefused) {
  ModelConfig config = testing::DenseMhaConfig();
  ModelWeights weights = testing::RandomWeights(config, 1);
  weights.layers[1].ffn.w2.mutable_f32()[7] = 3.4e38f;
  auto refused = cuda::DeviceWeights::Upload(config, weights, cuda::WeightFormat::k16Bit);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_NE(refused.status().message().find("tensor layers.1.ffn.w2.weight"), std::string::npos)
      << refused.status();
  EXPECT_NE(refused.status().message().find("element 7 "), std::string::npos) << refused.status();
  EXPECT_NE(refused.status().message().find("BF16"), std::string::npos) << refused.status();
  EXPECT_NE(refused.status().message().find("--allow-non-finite-weights"), std::string::npos)
      << refused.status();
  EXPECT_TRUE(cuda::DeviceWeights::Upload(config, weights, cuda::WeightFormat::kFloat32).ok());

  const Kept kept = Upload({0x1.fep127f, -0x1.fep127f, 1.0f}, cuda::WeightFormat::k16Bit);
  EXPECT_EQ(kept.type, cuda::WeightType::kBf16);
  EXPECT_EQ(kept.values, (std::vector<float>{0x1.fep127f, -0x1.fep127f, 1.0f}));
}

// --allow-non-finite-weights (ModelLoadOptions::allow_non_finite_weights)
// lets the CUDA backend hold such a weight as the loader holds one: it is
// uploaded infinite, with a warning naming the tensor and the element; the
// backend created with CudaBackendOptions::allow_non_finite_weights too.
TEST(CudaWeightsTest, AllowedNonFiniteWeightsAreHeldWithAWarning) {
  const float kBeyondBf16 = 3.4e38f;
  Kept kept = Upload({kBeyondBf16, 1.0f}, cuda::WeightFormat::k16Bit,
                     /*allow_non_finite_weights=*/true);
  EXPECT_EQ(kept.type, cuda::WeightType::kBf16);
  EXPECT_EQ(kept.values, (std::vector<float>{std::numeric_limits<float>::infinity(), 1.0f}));

  ModelConfig config = testing::DenseMhaConfig();
  ModelWeights weights = testing::RandomWeights(config, 1);
  weights.layers[1].ffn.w2.mutable_f32()[7] = kBeyondBf16;
  std::vector<std::string> warnings;
  auto uploaded = cuda::DeviceWeights::Upload(config, weights, cuda::WeightFormat::k16Bit,
                                              /*allow_non_finite_weights=*/true, &warnings);
  ASSERT_TRUE(uploaded.ok()) << uploaded.status();
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(
      warnings[0].rfind("tensor layers.1.ffn.w2.weight holds non-finite values (element 7 ", 0), 0u)
      << warnings[0];
  EXPECT_NE(warnings[0].find("once held as BF16"), std::string::npos) << warnings[0];

  for (const bool allow : {false, true}) {
    warnings.clear();
    CudaBackendOptions options;
    options.allow_non_finite_weights = allow;
    options.warnings = &warnings;
    auto backend = CreateCudaBackend(config, weights, config.dispatch, options);
    EXPECT_EQ(backend.ok(), allow) << backend.status();
    if (allow) {
      ASSERT_EQ(warnings.size(), 1u);
      EXPECT_NE(warnings[0].find("tensor layers.1.ffn.w2.weight "), std::string::npos);
    } else {
      EXPECT_TRUE(warnings.empty());
      EXPECT_EQ(backend.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(backend.status().message().find("--allow-non-finite-weights"), std::string::npos)
          << backend.status();
    }
  }
}

}  // namespace
}  // namespace switchserve
