// config.json: arbitrary text through ParseModelConfig. An accepted config
// writes back (ModelConfigToJson) to text that parses to the same config, and
// every size the loader derives from it before reading weights is computed
// without overflow.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "engine/model/host_memory.h"
#include "engine/model/model_config.h"
#include "engine/model/model_loader.h"
#include "engine/runtime/kv_cache.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace switchserve;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<ModelConfig> config = ParseModelConfig(text, "config.json");
  if (!config.ok()) {
    FUZZ_CHECK(config.status().message().find("config.json") == 0);  // names the file
    return 0;
  }
  const std::string json = ModelConfigToJson(*config);
  absl::StatusOr<ModelConfig> again = ParseModelConfig(json, "config.json");
  FUZZ_CHECK(again.ok());
  FUZZ_CHECK(ModelConfigToJson(*again) == json);

  FUZZ_CHECK(KvBytesPerToken(*config, 4) > 0);
  for (int64_t tokens : {int64_t{1}, int64_t{4096}, int64_t{1} << 40}) {
    const int64_t capacity =
        config->dispatch.CapacityPerExpert(tokens, config->ffn.top_k, config->ffn.n_experts);
    FUZZ_CHECK(capacity >= 0 && capacity <= DispatchConfig::kMaxCapacity);
  }
  // The loader lists the expected tensors only for as many layers as the
  // file has tensors (it refuses more first); a fuzzed file would hold few.
  if (config->n_layers <= 64) {
    int64_t bytes = 0;
    for (const ExpectedTensor& tensor : ExpectedTensors(*config)) {
      int64_t elements = 1;
      for (int64_t dim : tensor.shape) {
        FUZZ_CHECK(dim >= 0);
        elements = SaturatingMul(elements, dim);
      }
      bytes = SaturatingAdd(bytes, SaturatingMul(elements, 4));
    }
    FUZZ_CHECK(bytes > 0);
  }
  return 0;
}
