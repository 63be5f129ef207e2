#include "tests/util/random_weights.h"

#include <random>
#include <string>

#include "engine/model_loader.h"

namespace switchserve::testing {

ModelWeights RandomWeights(const ModelConfig& config, uint32_t seed, float scale) {
  ModelWeights weights;
  weights.layers.resize(config.n_layers);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(-scale, scale);
  for (const ExpectedTensor& e : ExpectedTensors(config)) {
    Tensor& tensor = e.In(weights);
    tensor.shape = e.shape;
    tensor.data.resize(e.numel());
    const bool is_norm_weight = e.name.find("norm.weight") != std::string::npos;
    for (float& x : tensor.data) x = (is_norm_weight ? 1.0f : 0.0f) + uniform(rng);
  }
  return weights;
}

}  // namespace switchserve::testing
