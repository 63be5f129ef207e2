// Loads a model directory (config.json, model.safetensors, tokenizer) into a
// validated Model. Every malformed input is reported as an error naming the
// file, the tensor or key, and expected vs found; nothing here crashes on bad
// files.
#ifndef SWITCHSERVE_ENGINE_MODEL_LOADER_H_
#define SWITCHSERVE_ENGINE_MODEL_LOADER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/model_config.h"
#include "engine/model_weights.h"
#include "engine/tokenizer.h"

namespace switchserve {

struct Model {
  std::string directory;
  ModelConfig config;
  ModelWeights weights;  // widened to f32
  std::unique_ptr<Tokenizer> tokenizer;
};

absl::StatusOr<std::unique_ptr<Model>> LoadModel(const std::string& directory);

// Checks `weights` against `config` (every tensor present with its expected
// shape, nothing extra). Used by LoadModel and by code that builds weights in
// memory (benchmarks, tests).
absl::Status ValidateWeights(const ModelConfig& config, const ModelWeights& weights);

}  // namespace switchserve

#endif  // SWITCHSERVE_ENGINE_MODEL_LOADER_H_
