// Loads a model directory (config.json, model.safetensors, tokenizer) into a
// validated Model. Every malformed input is reported as an error naming the
// file, the tensor or key, and expected vs found; nothing here crashes on bad
// files.
#ifndef SWITCHSERVE_ENGINE_MODEL_MODEL_LOADER_H_
#define SWITCHSERVE_ENGINE_MODEL_MODEL_LOADER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/model_config.h"
#include "engine/model/model_weights.h"
#include "engine/model/safetensors.h"
#include "engine/text/tokenizer.h"

namespace switchserve {

struct Model {
  std::string directory;
  ModelConfig config;
  ModelWeights weights;  // held as ModelLoadOptions says
  std::unique_ptr<Tokenizer> tokenizer;
  // What loading let pass but the operator should hear about (non-finite
  // weights under ModelLoadOptions::allow_non_finite_weights).
  std::vector<std::string> warnings;
};

// The dtype the weight matrices (projections, experts, embedding, output
// head) are held in. Norms, biases, routers and the XL position projection
// are always held in f32 (ExpectedTensor::held_in_f32).
enum class WeightsDtype {
  kAsStored,  // as model.safetensors stores them: no widening of f16 / bf16
  kF32,       // widened (or kept) f32: what the golden vectors are checked in
  kBF16,      // narrowed to bf16 (round to nearest even) where stored wider
  kF16,
};
// "auto", "f32", "bf16", "f16".
std::string_view ToString(WeightsDtype dtype);
// The inverse of ToString; INVALID_ARGUMENT names the accepted values.
absl::StatusOr<WeightsDtype> ParseWeightsDtype(std::string_view text);

struct ModelLoadOptions {
  WeightsDtype weights_dtype = WeightsDtype::kAsStored;
  // Non-finite weights (NaN, +-inf, as stored or once converted) are an error
  // naming the tensor; set, they are loaded and reported in Model::warnings.
  bool allow_non_finite_weights = false;
  // > 0: the context, config.max_seq_len, cut to this many positions (at
  // most the model's; more is INVALID_ARGUMENT). 0: the model's.
  int max_seq_len = 0;
};

// Reads <directory>/config.json, <directory>/model.safetensors (every tensor
// of ExpectedTensors(config), F32/F16/BF16, nothing else; held as `options`
// says) and the tokenizer (<directory>/tokenizer.model for "sentencepiece",
// whose piece count must not exceed vocab_size). NOT_FOUND when a file is
// missing, INVALID_ARGUMENT for anything malformed (non-finite weights, as
// stored or as held, included, unless `options` allow them); messages name the
// file, the key or tensor, and expected vs found. RESOURCE_EXHAUSTED before
// reading weights that, as held, cannot fit in the host's memory.
absl::StatusOr<std::unique_ptr<Model>> LoadModel(const std::string& directory,
                                                 const ModelLoadOptions& options = {});

// `weights` with every matrix (not held_in_f32) converted as `dtype` says,
// for weights built in memory (tests, benchmarks). kAsStored changes nothing.
ModelWeights ConvertWeights(const ModelConfig& config, const ModelWeights& weights,
                            WeightsDtype dtype);

// The index of the first non-finite value (NaN, +-inf) of `t`, any dtype, or
// -1. LoadModel refuses weights holding one, as stored or as held; a backend
// that narrows a tensor itself checks what it holds with it too.
int64_t FirstNonFinite(const Tensor& t);

// Checks `weights` against `config` (every tensor present with its expected
// shape, nothing extra). Used by LoadModel and by code that builds weights in
// memory (benchmarks, tests).
absl::Status ValidateWeights(const ModelConfig& config, const ModelWeights& weights);

// One tensor that a config calls for: its name in model.safetensors, its shape
// (docs/model-format.md) and where it lives in ModelWeights.
struct ExpectedTensor {
  std::string name;  // e.g. "layers.0.attn.v"
  std::vector<int64_t> shape;
  int layer = -1;  // index into ModelWeights::layers; -1 for model-level tensors
  Tensor& (*select)(ModelWeights& weights, int layer) = nullptr;
  // Norms, biases and router weights: held in f32 whatever the file stores
  // (they are small, and routing decisions are made in f32). The projection
  // and expert matrices, the embedding and the output head are held in the
  // weights dtype (ModelLoadOptions).
  bool held_in_f32 = false;

  // The matching tensor. `weights.layers` must have more than `layer` entries.
  Tensor& In(ModelWeights& weights) const { return select(weights, layer); }
  const Tensor& In(const ModelWeights& weights) const {
    return select(const_cast<ModelWeights&>(weights), layer);
  }
  int64_t numel() const;
};

// Every tensor `config` calls for, in a fixed order (model-level tensors, then
// layer by layer). Every other Tensor of ModelWeights must stay empty. Shapes
// are computed in int64 without overflow checks: configs come from
// ParseModelConfig, whose dimensions fit in int32.
std::vector<ExpectedTensor> ExpectedTensors(const ModelConfig& config);

// The dtype LoadModel holds `e` in when the file stores it as `stored`.
DType HeldDtype(const ExpectedTensor& e, DType stored, WeightsDtype policy);

// Writes a model directory that LoadModel reads back: config.json
// (ModelConfigToJson) and model.safetensors with every expected tensor stored
// as `dtype` (F32, F16 or BF16; narrowing rounds to nearest even; weights held
// in half precision are widened first). Validates `weights` first. Creates `directory` if needed.
// Does not write tokenizer.model: a SentencePiece model must be copied there by the caller.
absl::Status WriteModelDirectory(const std::string& directory, const ModelConfig& config,
                                 const ModelWeights& weights, DType dtype);

}  // namespace switchserve

#endif  // SWITCHSERVE_ENGINE_MODEL_MODEL_LOADER_H_
