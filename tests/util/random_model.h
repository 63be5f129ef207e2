// In-memory models for tests and benchmarks: small ModelConfigs covering every
// architecture variant, and random f32 weights shaped per docs/model-format.md.
#ifndef SWITCHSERVE_TESTS_UTIL_RANDOM_MODEL_H_
#define SWITCHSERVE_TESTS_UTIL_RANDOM_MODEL_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "engine/model/model_config.h"
#include "engine/model/model_weights.h"

namespace switchserve::testing {

// Random weights for `config`, deterministic in `seed`. Linear maps are
// uniform in +-1/sqrt(fan_in); norm weights near 1, biases small.
ModelWeights RandomWeights(const ModelConfig& config, uint64_t seed);

// A tiny SwitchAll model: SwitchHead attention (H=4, G=4, dh=8, E=4, k=2,
// sigmoid gates, source value routing), MoE FFN (X=4, k=2, softmax, gelu,
// biases), layernorm, tied embeddings, 2 layers, d=32, vocab 64, dropless.
ModelConfig TinySwitchAllConfig();
ModelConfig SwitchHeadSoftmaxTopKConfig();   // gate softmax_topk, MoE FFN top-1 (Switch)
ModelConfig SwitchHeadSharedRouterConfig();  // shared_router, sigmoid MoE FFN with router bias
ModelConfig SwitchHeadGqaConfig();           // G=2 of H=4, rmsnorm, untied head
ModelConfig SwitchHeadDestinationConfig();   // destination value routing, G=2
ModelConfig SwitchHeadSingleExpertConfig();  // E=1 (dense V/O, per-head output gate), dense FFN
ModelConfig DenseMhaConfig();                // dense attention, dense FFN (relu), untied
ModelConfig DenseGqaConfig();                // dense attention G=2, MoE FFN top-2 renormalised silu
// XL relative positions (no RoPE), each with a head size other than d/H:
ModelConfig XlSwitchAllConfig();     // H=3, dh=12, E=5, k=3; sigmoid MoE FFN; output bias (tied)
ModelConfig XlSingleExpertConfig();  // E=1, H=2, dh=20, rmsnorm, dense FFN; output bias (untied)
ModelConfig XlDenseGqaConfig();      // dense attention G=2 of H=4, dh=6, MoE FFN top-1
ModelConfig XlSharedDestinationConfig();  // shared router, destination values, G=2, softmax_topk

// The paper's 262M SwitchAll shape (Csordas et al.): d = 1024, 18 layers,
// SwitchHead H = 4, E = 4, k = 2, dh = 112, sigmoid gates; MoE FFN of 32
// experts of size 128, sigmoid gates, k = 4, relu, no biases; vocabulary
// 8000, context 2048, layernorm, tied embeddings, dropless.
ModelConfig PaperSwitchAllConfig();

struct NamedConfig {
  std::string name;
  ModelConfig config;
};
inline void PrintTo(const NamedConfig& named, std::ostream* os) { *os << named.name; }
// All of the above, named.
std::vector<NamedConfig> AllVariantConfigs();
// Those of them with at least one router (MoE attention or FFN).
std::vector<NamedConfig> RoutedVariantConfigs();

}  // namespace switchserve::testing

#endif  // SWITCHSERVE_TESTS_UTIL_RANDOM_MODEL_H_
