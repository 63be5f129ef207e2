#include "tests/util/golden.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "engine/model/model_loader.h"
#include "engine/model/safetensors.h"
#include "tests/util/test_util.h"

namespace switchserve::testing {
namespace {

absl::StatusOr<std::vector<int32_t>> ReadI32(const SafetensorsFile& file, const std::string& name) {
  const TensorInfo* info = file.Find(name);
  if (info == nullptr) return absl::NotFoundError(absl::StrCat(file.path(), ": no ", name));
  if (info->dtype != DType::kI32) {
    return absl::InvalidArgumentError(absl::StrCat(file.path(), ": ", name, " is not I32"));
  }
  std::vector<int32_t> values(info->numel());
  std::memcpy(values.data(), info->data, values.size() * sizeof(int32_t));
  return values;
}

template <typename T>
absl::Status Assign(absl::StatusOr<T> value, T* out) {
  if (!value.ok()) return value.status();
  *out = *std::move(value);
  return absl::OkStatus();
}

}  // namespace

std::vector<std::string> ListGoldenVariants(GoldenFilter filter) {
  std::vector<std::string> names;
  const std::filesystem::path root = SourcePath("tests/golden");
  if (!std::filesystem::exists(root)) return names;
  for (const auto& entry : std::filesystem::directory_iterator(root)) {
    if (!entry.is_directory() || !std::filesystem::exists(entry.path() / "golden.safetensors")) {
      continue;
    }
    if (filter != GoldenFilter::kAll) {
      std::ifstream in(entry.path() / "config.json");
      std::stringstream text;
      text << in.rdbuf();
      absl::StatusOr<ModelConfig> config = ParseModelConfig(text.str(), "config.json");
      if (!config.ok()) continue;
      const DispatchConfig& dispatch = config->dispatch;
      const bool independent = dispatch.Dropless() || (filter == GoldenFilter::kBatchIndependent &&
                                                       dispatch.scope == CapacityScope::kSequence);
      if (!independent) continue;
    }
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<std::string> ListScheduledGoldenVariants() {
  std::vector<std::string> names;
  for (const std::string& name : ListGoldenVariants()) {
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> file =
        SafetensorsFile::Open(SourcePath("tests/golden/" + name + "/golden.safetensors"));
    if (file.ok() && (*file)->Find("steps") != nullptr) names.push_back(name);
  }
  return names;
}

absl::StatusOr<GoldenCase> LoadGolden(const std::string& variant) {
  GoldenCase golden;
  golden.name = variant;
  golden.model_dir = SourcePath("tests/golden/" + variant);
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> file =
      SafetensorsFile::Open(golden.model_dir + "/golden.safetensors");
  if (!file.ok()) return file.status();
  std::vector<int32_t> tokens, seq_lens;
  absl::Status status = Assign(ReadI32(**file, "tokens"), &tokens);
  if (status.ok()) status = Assign(ReadI32(**file, "seq_lens"), &seq_lens);
  if (status.ok()) status = Assign((*file)->ReadAsF32("logits"), &golden.logits);
  if (!status.ok()) return status;
  size_t offset = 0;
  for (int32_t len : seq_lens) {
    golden.sequences.emplace_back(tokens.begin() + offset, tokens.begin() + offset + len);
    offset += len;
  }
  if (const TensorInfo* info = (*file)->Find("steps"); info != nullptr) {
    std::vector<int32_t> steps;
    if (status = Assign(ReadI32(**file, "steps"), &steps); !status.ok()) return status;
    if (info->shape.size() != 2 || info->shape[1] != static_cast<int64_t>(seq_lens.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat((*file)->path(), ": steps: expected shape [S, ", seq_lens.size(), "]"));
    }
    for (int64_t s = 0; s < info->shape[0]; ++s) {
      golden.steps.emplace_back(steps.begin() + s * info->shape[1],
                                steps.begin() + (s + 1) * info->shape[1]);
    }
  }

  absl::StatusOr<std::unique_ptr<Model>> model = LoadModel(golden.model_dir);
  if (!model.ok()) return model.status();
  const RouterLayout layout((*model)->config);
  for (const RouterId& id : layout.routers()) {
    GoldenRouter router;
    router.id = id;
    const std::string prefix =
        absl::StrCat("stats.", id.layer, ".", std::string(ToString(id.module)), ".", id.head, ".");
    std::vector<int32_t> routed, kept, rerouted, dropped, count;
    std::vector<float> prob_sum, aux;
    status = Assign(ReadI32(**file, prefix + "routed"), &routed);
    if (status.ok()) status = Assign(ReadI32(**file, prefix + "kept"), &kept);
    if (status.ok()) status = Assign(ReadI32(**file, prefix + "rerouted"), &rerouted);
    if (status.ok()) status = Assign(ReadI32(**file, prefix + "dropped"), &dropped);
    if (status.ok()) status = Assign(ReadI32(**file, prefix + "tokens"), &count);
    if (status.ok()) status = Assign((*file)->ReadAsF32(prefix + "prob_sum"), &prob_sum);
    if (status.ok()) status = Assign((*file)->ReadAsF32(prefix + "aux_loss"), &aux);
    const std::string route =
        absl::StrCat("route.", id.layer, ".", std::string(ToString(id.module)), ".", id.head, ".");
    if (status.ok()) status = Assign(ReadI32(**file, route + "expert"), &router.expert);
    if (status.ok()) status = Assign(ReadI32(**file, route + "fate"), &router.fate);
    if (status.ok()) status = Assign((*file)->ReadAsF32(route + "gate"), &router.gate);
    if (!status.ok()) return status;
    router.stats.tokens = count.at(0);
    router.stats.routed.assign(routed.begin(), routed.end());
    router.stats.kept.assign(kept.begin(), kept.end());
    router.stats.rerouted.assign(rerouted.begin(), rerouted.end());
    router.stats.dropped.assign(dropped.begin(), dropped.end());
    router.stats.prob_sum.assign(prob_sum.begin(), prob_sum.end());
    router.aux_loss = aux.at(0);
    golden.routers.push_back(std::move(router));
  }
  return golden;
}

}  // namespace switchserve::testing
