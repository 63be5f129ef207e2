#include "engine/model/model_loader.h"

#include <cerrno>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/model/host_memory.h"

namespace switchserve {
namespace {

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

std::string JoinPath(const std::string& directory, const char* file) {
  return (std::filesystem::path(directory) / file).string();
}

// Whether a failed stat's `error` means that nothing is at the path (rather
// than, say, a directory on the way that this user may not search).
bool IsNotFound(const std::error_code& error) {
  return error == std::errc::no_such_file_or_directory || error == std::errc::not_a_directory;
}

// A text file of at most `max_bytes` bytes, whole.
absl::StatusOr<std::string> ReadTextFile(const std::string& path, uintmax_t max_bytes) {
  std::error_code error;
  const std::filesystem::file_status status = std::filesystem::status(path, error);
  if (error && !IsNotFound(error)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": cannot access: ", error.message()));
  }
  if (!std::filesystem::exists(status)) {
    return absl::NotFoundError(absl::StrCat(path, ": not found"));
  }
  if (!std::filesystem::is_regular_file(status)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  if (const uintmax_t size = std::filesystem::file_size(path, error); !error && size > max_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", size, " bytes, more than the ", max_bytes, " this file may have"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in.is_open()) {
    // The stream keeps no error of its own; open(2)'s errno is still set.
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": cannot open: ", std::generic_category().message(errno)));
  }
  std::ostringstream text;
  text << in.rdbuf();
  if (!in.good() && !in.eof()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": read failed"));
  }
  return text.str();
}

}  // namespace

DType HeldDtype(const ExpectedTensor& e, DType stored, WeightsDtype policy) {
  if (e.held_in_f32) return DType::kF32;
  switch (policy) {
    case WeightsDtype::kAsStored:
      return stored;
    case WeightsDtype::kF32:
      return DType::kF32;
    case WeightsDtype::kBF16:
      return DType::kBF16;
    case WeightsDtype::kF16:
      return DType::kF16;
  }
  return stored;
}

// Half-precision values are checked on their bits: all exponent bits set is
// inf or NaN.
int64_t FirstNonFinite(const Tensor& t) {
  const int64_t n = t.size();
  switch (t.dtype()) {
    case DType::kBF16:
    case DType::kF16: {
      const uint16_t exponent = t.dtype() == DType::kBF16 ? 0x7f80 : 0x7c00;
      const uint16_t* bits = t.half();
      for (int64_t i = 0; i < n; ++i) {
        if ((bits[i] & exponent) == exponent) return i;
      }
      return -1;
    }
    default: {
      const float* values = t.f32();
      for (int64_t i = 0; i < n; ++i) {
        if (!std::isfinite(values[i])) return i;
      }
      return -1;
    }
  }
}

namespace {

// Fills model->weights from `file`, checking it holds exactly the tensors the
// config calls for.
absl::Status LoadWeights(const SafetensorsFile& file, const ModelLoadOptions& options,
                         Model* model) {
  // Every layer has several tensors; refuse before allocating per-layer
  // tables for an absurd n_layers.
  if (static_cast<size_t>(model->config.n_layers) > file.tensors().size()) {
    return absl::InvalidArgumentError(absl::StrCat(file.path(), ": holds ", file.tensors().size(),
                                                   " tensors, too few for config.json n_layers ",
                                                   model->config.n_layers));
  }
  const std::vector<ExpectedTensor> expected = ExpectedTensors(model->config);
  // Refuse a model whose weights, as they will be held (options.weights_dtype),
  // cannot fit before reading any of them. A tensor the file lacks or stores
  // in another dtype is counted as f32 (it is refused below anyway).
  int64_t weight_bytes = 0;
  for (const ExpectedTensor& e : expected) {
    int64_t elements = 1;
    for (int64_t dim : e.shape) elements = SaturatingMul(elements, dim);
    const TensorInfo* info = file.Find(e.name);
    const bool known =
        info != nullptr &&
        (info->dtype == DType::kF32 || info->dtype == DType::kF16 || info->dtype == DType::kBF16);
    const int64_t size =
        known ? DTypeSize(HeldDtype(e, info->dtype, options.weights_dtype)) : sizeof(float);
    weight_bytes = SaturatingAdd(weight_bytes, SaturatingMul(elements, size));
  }
  if (absl::Status fits = CheckFitsInHostMemory(
          weight_bytes, absl::StrCat(file.path(), ": the weights config.json calls for"));
      !fits.ok()) {
    return fits;
  }
  std::set<std::string> expected_names;
  for (const ExpectedTensor& e : expected) expected_names.insert(e.name);
  std::vector<std::string> unexpected;
  for (const auto& [name, info] : file.tensors()) {
    if (expected_names.count(name) == 0) {
      unexpected.push_back(absl::StrCat(name, " ", ShapeText(info.shape)));
    }
  }
  model->weights.layers.resize(model->config.n_layers);
  for (const ExpectedTensor& e : expected) {
    const TensorInfo* info = file.Find(e.name);
    if (info == nullptr) {
      // A misspelt name shows up as one missing and one unexpected tensor:
      // name both.
      return absl::InvalidArgumentError(absl::StrCat(
          file.path(), ": missing tensor ", e.name, " (expected shape ", ShapeText(e.shape), ")",
          unexpected.empty() ? "" : "; the file has unexpected tensor ",
          unexpected.empty() ? "" : unexpected.front()));
    }
    if (info->dtype != DType::kF32 && info->dtype != DType::kF16 && info->dtype != DType::kBF16) {
      return absl::InvalidArgumentError(absl::StrCat(file.path(), ": tensor ", e.name,
                                                     ": expected dtype F32, F16 or BF16, found ",
                                                     std::string(ToString(info->dtype))));
    }
    if (info->shape != e.shape) {
      return absl::InvalidArgumentError(absl::StrCat(file.path(), ": tensor ", e.name,
                                                     ": expected shape ", ShapeText(e.shape),
                                                     ", found ", ShapeText(info->shape)));
    }
    const size_t count = info->size_bytes / static_cast<size_t>(DTypeSize(info->dtype));
    Tensor stored = Tensor::FromBytes(e.shape, info->dtype, info->data, count);
    // Converted only to another dtype: a copy of every tensor as stored
    // doubled the largest tensor's bytes at load.
    std::optional<Tensor> converted;
    if (const DType dtype = HeldDtype(e, info->dtype, options.weights_dtype);
        dtype != stored.dtype()) {
      converted = stored.ConvertedTo(dtype);
    }
    const Tensor& held = converted.has_value() ? *converted : stored;
    // Checked as stored (a NaN in any dtype) and as held: narrowing to f16
    // turns values beyond 65504 into infinities.
    const bool bad_as_stored = FirstNonFinite(stored) >= 0;
    if (const int64_t bad = FirstNonFinite(bad_as_stored ? stored : held); bad >= 0) {
      const Tensor& t = bad_as_stored ? stored : held;
      std::string problem =
          absl::StrCat(file.path(), ": tensor ", e.name, " holds non-finite values (element ", bad,
                       " of ", t.size(), " is ", t.At(bad), ")");
      if (!bad_as_stored) {
        problem = absl::StrCat(problem, " once held as ", std::string(ToString(t.dtype())),
                               " (--weights-dtype ", std::string(ToString(options.weights_dtype)),
                               "; stored ", stored.At(bad), ")");
      }
      if (!options.allow_non_finite_weights) {
        return absl::InvalidArgumentError(
            absl::StrCat(problem, "; --allow-non-finite-weights loads it anyway"));
      }
      model->warnings.push_back(std::move(problem));
    }
    e.In(model->weights) = converted.has_value() ? std::move(*converted) : std::move(stored);
  }
  if (!unexpected.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(file.path(), ": unexpected tensor ",
                                                   unexpected.front(),
                                                   " (config.json does not call for it)"));
  }
  return absl::OkStatus();
}

absl::Status LoadTokenizer(const std::string& directory, Model* model) {
  if (model->config.tokenizer == TokenizerKind::kByte) {
    model->tokenizer = CreateByteTokenizer();
    return absl::OkStatus();
  }
  const std::string path = JoinPath(directory, "tokenizer.model");
  absl::StatusOr<std::unique_ptr<Tokenizer>> tokenizer = LoadSentencePieceTokenizer(path);
  if (!tokenizer.ok()) {
    if (absl::IsNotFound(tokenizer.status())) {
      return absl::NotFoundError(absl::StrCat(
          path, ": not found (config.json declares \"tokenizer\": \"sentencepiece\")"));
    }
    return tokenizer.status();
  }
  if ((*tokenizer)->vocab_size() > model->config.vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": SentencePiece vocabulary has ", (*tokenizer)->vocab_size(),
                     " pieces, more than config.json vocab_size ", model->config.vocab_size));
  }
  model->tokenizer = *std::move(tokenizer);
  return absl::OkStatus();
}

}  // namespace

std::string_view ToString(WeightsDtype dtype) {
  switch (dtype) {
    case WeightsDtype::kAsStored:
      return "auto";
    case WeightsDtype::kF32:
      return "f32";
    case WeightsDtype::kBF16:
      return "bf16";
    case WeightsDtype::kF16:
      return "f16";
  }
  return "?";
}

absl::StatusOr<WeightsDtype> ParseWeightsDtype(std::string_view text) {
  for (WeightsDtype dtype :
       {WeightsDtype::kAsStored, WeightsDtype::kF32, WeightsDtype::kBF16, WeightsDtype::kF16}) {
    if (text == ToString(dtype)) return dtype;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("weights dtype \"", std::string(text), "\": expected auto, f32, bf16 or f16"));
}

ModelWeights ConvertWeights(const ModelConfig& config, const ModelWeights& weights,
                            WeightsDtype dtype) {
  ModelWeights out = weights;
  for (const ExpectedTensor& e : ExpectedTensors(config)) {
    Tensor& t = e.In(out);
    t = t.ConvertedTo(HeldDtype(e, t.dtype(), dtype));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Model>> LoadModel(const std::string& directory,
                                                 const ModelLoadOptions& options) {
  std::error_code error;
  if (!std::filesystem::is_directory(directory, error)) {
    if (error && !IsNotFound(error)) {
      return absl::InvalidArgumentError(
          absl::StrCat(directory, ": cannot access: ", error.message()));
    }
    return absl::NotFoundError(absl::StrCat(directory, ": not a model directory"));
  }
  auto model = std::make_unique<Model>();
  model->directory = directory;
  const std::string config_path = JoinPath(directory, "config.json");
  // A config is a few KiB; 1 MiB leaves room for any name and comment.
  absl::StatusOr<std::string> config_text = ReadTextFile(config_path, uintmax_t{1} << 20);
  if (!config_text.ok()) return config_text.status();
  absl::StatusOr<ModelConfig> config = ParseModelConfig(*config_text, config_path);
  if (!config.ok()) return config.status();
  model->config = *std::move(config);
  if (options.max_seq_len > model->config.max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-model-len ", options.max_seq_len, " exceeds the model's context length ",
        model->config.max_seq_len, " (max_seq_len in ", config_path, ")"));
  }
  if (options.max_seq_len > 0) model->config.max_seq_len = options.max_seq_len;

  {
    // The mapping is released when `file` goes out of scope; the weights are copies.
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> file =
        SafetensorsFile::Open(JoinPath(directory, "model.safetensors"));
    if (!file.ok()) return file.status();
    if (absl::Status status = LoadWeights(**file, options, model.get()); !status.ok()) {
      return status;
    }
  }
  if (absl::Status status = LoadTokenizer(directory, model.get()); !status.ok()) return status;
  return model;
}

absl::Status WriteModelDirectory(const std::string& directory, const ModelConfig& config,
                                 const ModelWeights& weights, DType dtype) {
  if (dtype != DType::kF32 && dtype != DType::kF16 && dtype != DType::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat("WriteModelDirectory: cannot store weights as ",
                                                   std::string(ToString(dtype))));
  }
  if (absl::Status status = ValidateWeights(config, weights); !status.ok()) return status;
  std::error_code error;
  std::filesystem::create_directories(directory, error);
  if (error) {
    return absl::InvalidArgumentError(
        absl::StrCat(directory, ": cannot create directory: ", error.message()));
  }
  const std::string config_path = JoinPath(directory, "config.json");
  {
    std::ofstream out(config_path, std::ios::binary | std::ios::trunc);
    out << ModelConfigToJson(config);
    out.close();
    if (!out) return absl::InvalidArgumentError(absl::StrCat(config_path, ": write failed"));
  }
  std::vector<TensorToWrite> tensors;
  std::vector<std::vector<float>> widened;  // values of tensors held in half precision
  const std::vector<ExpectedTensor> expected = ExpectedTensors(config);
  widened.reserve(expected.size());
  for (const ExpectedTensor& e : expected) {
    const Tensor& t = e.In(weights);
    const float* values =
        t.dtype() == DType::kF32 ? t.f32() : widened.emplace_back(t.ToF32()).data();
    tensors.push_back({e.name, e.shape, values, dtype});
  }
  return WriteSafetensors(JoinPath(directory, "model.safetensors"), tensors);
}

}  // namespace switchserve
