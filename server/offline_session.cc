#include "server/offline_session.h"

#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "kernels/backends.h"
#include "server/commands.h"
#include "server/common_flags.h"
#include "server/dispatch_flags.h"

namespace switchserve {

absl::StatusOr<OfflineSession> OpenOfflineSession() {
  std::string directory = absl::GetFlag(FLAGS_model);
  if (directory.empty()) directory = DefaultModelDirectory();
  OfflineSession session;
  absl::StatusOr<ModelLoadOptions> load = LoadOptionsFromFlags();
  if (!load.ok()) return load.status();
  absl::StatusOr<std::unique_ptr<Model>> model = LoadModel(directory, *load);
  if (!model.ok()) return model.status();
  for (const std::string& warning : (*model)->warnings) {
    std::fprintf(stderr, "warning: %s\n", warning.c_str());
  }
  session.model = *std::move(model);
  absl::StatusOr<DeviceKind> device = ParseDeviceKind(absl::GetFlag(FLAGS_device));
  if (!device.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--device: ", device.status().message()));
  }
  absl::StatusOr<KvCacheDtype> kv_dtype = KvCacheDtypeFromFlags();
  if (!kv_dtype.ok()) return kv_dtype.status();
  absl::StatusOr<std::optional<cpu::KernelIsa>> cpu_kernels = CpuKernelsFromFlags();
  if (!cpu_kernels.ok()) return cpu_kernels.status();
  absl::StatusOr<int> threads = ThreadsFromFlags();
  if (!threads.ok()) return threads.status();
  absl::StatusOr<int> kv_block_size = KvBlockSizeFromFlags();
  if (!kv_block_size.ok()) return kv_block_size.status();
  session.kv_block_size = *kv_block_size;
  absl::StatusOr<DispatchOverrides> overrides = DispatchOverridesFromFlags();
  if (!overrides.ok()) return overrides.status();
  absl::StatusOr<DispatchConfig> dispatch =
      ApplyDispatchOverrides(session.model->config.dispatch, *overrides);
  if (!dispatch.ok()) return dispatch.status();
  session.dispatch = *dispatch;
  std::vector<std::string> warnings;
  absl::StatusOr<std::unique_ptr<Backend>> backend =
      CreateBackend(*device, session.model->config, session.model->weights, session.dispatch,
                    BackendOptions{.num_threads = *threads,
                                   .kv_cache_dtype = *kv_dtype,
                                   .cpu_weight_copies = absl::GetFlag(FLAGS_cpu_weight_copies),
                                   .cpu_kernels = *cpu_kernels,
                                   .cuda_f32_weights = load->weights_dtype == WeightsDtype::kF32,
                                   .allow_non_finite_weights = load->allow_non_finite_weights,
                                   .warnings = &warnings});
  if (!backend.ok()) {
    return absl::Status(backend.status().code(),
                        absl::StrCat("--device ", std::string(ToString(*device)), ": ",
                                     backend.status().message()));
  }
  for (const std::string& warning : warnings) {
    std::fprintf(stderr, "warning: %s\n", warning.c_str());
  }
  session.backend = *std::move(backend);
  return session;
}

}  // namespace switchserve
