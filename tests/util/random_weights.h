// Random model weights for tests: every tensor a config calls for
// (ExpectedTensors), filled from a seeded generator.
#ifndef SWITCHSERVE_TESTS_UTIL_RANDOM_WEIGHTS_H_
#define SWITCHSERVE_TESTS_UTIL_RANDOM_WEIGHTS_H_

#include <cstdint>

#include "engine/model_config.h"
#include "engine/model_weights.h"

namespace switchserve::testing {

// Uniform in [-scale, scale]; norm weights in [1 - scale, 1 + scale]. The same
// seed gives the same weights.
ModelWeights RandomWeights(const ModelConfig& config, uint32_t seed, float scale = 0.5f);

}  // namespace switchserve::testing

#endif  // SWITCHSERVE_TESTS_UTIL_RANDOM_WEIGHTS_H_
