// A whole model directory through LoadModel: the input is one options byte
// (the weights dtype, whether non-finite weights are allowed), config.json up
// to the first NUL byte, and model.safetensors after it; the directory also
// holds the SentencePiece test model as tokenizer.model. The seeds are tiny
// models that load, so that mutations reach what neither file's own target
// does: the tensors against the config (names, shapes, dtypes, counts), the
// conversion to the weights dtype and the non-finite checks.
// A refusal is INVALID_ARGUMENT or RESOURCE_EXHAUSTED naming a file of the
// directory. A loaded model holds exactly the tensors the config calls for,
// each in the dtype the options say, with the stored values (bit for bit
// where the dtype is kept, widened exactly to f32); finite unless allowed,
// and then every non-finite tensor is reported; its config is the file's,
// its tokenizer the one the config names, within vocab_size.
#include <unistd.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <string_view>

#include "engine/model/model_config.h"
#include "engine/model/model_loader.h"
#include "engine/model/safetensors.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using namespace switchserve;

// A directory of this process's own, removed at exit.
const std::string& Directory() {
  static const std::string* const directory = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern = std::string(tmp != nullptr ? tmp : "/tmp") + "/switchserve-model.XXXXXX";
    FUZZ_CHECK(mkdtemp(pattern.data()) != nullptr);
    std::filesystem::create_symlink(SWITCHSERVE_SOURCE_DIR "/tests/data/spm/tokenizer.model",
                                    std::filesystem::path(pattern) / "tokenizer.model");
    std::atexit([] { std::filesystem::remove_all(Directory()); });
    return new std::string(pattern);
  }();
  return *directory;
}

void WriteFile(const std::string& path, std::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  FUZZ_CHECK(out.good());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string& directory = Directory();
  ModelLoadOptions options;
  static constexpr WeightsDtype kDtypes[] = {WeightsDtype::kAsStored, WeightsDtype::kF32,
                                             WeightsDtype::kBF16, WeightsDtype::kF16};
  options.weights_dtype = kDtypes[data[0] % 4];
  options.allow_non_finite_weights = data[0] & 4;
  const std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  const size_t nul = rest.find('\0');
  const std::string_view config_text = rest.substr(0, nul);
  const std::string_view file_bytes =
      nul == std::string_view::npos ? std::string_view() : rest.substr(nul + 1);
  WriteFile(directory + "/config.json", config_text);
  WriteFile(directory + "/model.safetensors", file_bytes);

  absl::StatusOr<std::unique_ptr<Model>> model = LoadModel(directory, options);
  if (!model.ok()) {
    FUZZ_CHECK(model.status().code() == absl::StatusCode::kInvalidArgument ||
               model.status().code() == absl::StatusCode::kResourceExhausted);
    FUZZ_CHECK(model.status().message().rfind(directory + "/", 0) == 0);  // names the file
    return 0;
  }

  // The config is the file's.
  absl::StatusOr<ModelConfig> config = ParseModelConfig(config_text, "config.json");
  FUZZ_CHECK(config.ok());
  FUZZ_CHECK(ModelConfigToJson((*model)->config) == ModelConfigToJson(*config));
  FUZZ_CHECK(ValidateWeights((*model)->config, (*model)->weights).ok());

  // Exactly the tensors called for, held as the options say, with the
  // stored values.
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file =
      SafetensorsFile::FromBytes(std::string(file_bytes), "model.safetensors");
  FUZZ_CHECK(file.ok());
  const std::vector<ExpectedTensor> expected = ExpectedTensors(*config);
  FUZZ_CHECK((*file)->tensors().size() == expected.size());
  bool any_non_finite = false;
  for (const ExpectedTensor& e : expected) {
    const TensorInfo* info = (*file)->Find(e.name);
    FUZZ_CHECK(info != nullptr);
    FUZZ_CHECK(info->shape == e.shape);
    const Tensor& held = e.In((*model)->weights);
    FUZZ_CHECK(held.shape() == e.shape);
    FUZZ_CHECK(held.dtype() == HeldDtype(e, info->dtype, options.weights_dtype));
    FUZZ_CHECK(held.size() == info->numel());
    absl::StatusOr<std::vector<float>> stored = (*file)->ReadAsF32(e.name);
    FUZZ_CHECK(stored.ok());
    if (held.dtype() == info->dtype) {
      FUZZ_CHECK(static_cast<size_t>(held.bytes()) == info->size_bytes);
      FUZZ_CHECK(info->size_bytes == 0 ||
                 std::memcmp(held.raw(), info->data, info->size_bytes) == 0);
    } else if (held.dtype() == DType::kF32) {
      for (int64_t i = 0; i < held.size(); ++i) {
        const float value = held.f32()[i], want = (*stored)[static_cast<size_t>(i)];
        FUZZ_CHECK(std::memcmp(&value, &want, sizeof value) == 0 ||
                   (std::isnan(value) && std::isnan(want)));
      }
    }
    bool non_finite = FirstNonFinite(held) >= 0;
    for (const float value : *stored) non_finite = non_finite || !std::isfinite(value);
    FUZZ_CHECK(options.allow_non_finite_weights || !non_finite);
    any_non_finite = any_non_finite || non_finite;
  }
  FUZZ_CHECK((*model)->warnings.empty() == !any_non_finite);
  for (const std::string& warning : (*model)->warnings) {
    FUZZ_CHECK(warning.rfind(directory + "/model.safetensors: tensor ", 0) == 0);
  }

  FUZZ_CHECK((*model)->tokenizer != nullptr);
  FUZZ_CHECK((*model)->tokenizer->kind() ==
             (config->tokenizer == TokenizerKind::kByte ? "byte" : "sentencepiece"));
  FUZZ_CHECK((*model)->tokenizer->vocab_size() <= config->vocab_size);
  return 0;
}
