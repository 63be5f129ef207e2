#include "kernels/backends.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_backend.h"

namespace switchserve {

std::string_view ToString(DeviceKind device) {
  switch (device) {
    case DeviceKind::kCpu:
      return "cpu";
    case DeviceKind::kCuda:
      return "cuda";
    case DeviceKind::kAuto:
      return "auto";
  }
  return "?";
}

absl::StatusOr<DeviceKind> ParseDeviceKind(std::string_view text) {
  for (DeviceKind device : {DeviceKind::kCpu, DeviceKind::kCuda, DeviceKind::kAuto}) {
    if (text == ToString(device)) return device;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("expected cpu, cuda or auto, found \"", std::string(text), "\""));
}

std::vector<DeviceKind> BuiltDevices() {
  // A device backend built into this binary adds itself here, ahead of the CPU.
  return {DeviceKind::kCpu};
}

absl::StatusOr<std::unique_ptr<Backend>> CreateBackend(DeviceKind device, const ModelConfig& config,
                                                       const ModelWeights& weights,
                                                       const DispatchConfig& dispatch,
                                                       const BackendOptions& options) {
  if (device == DeviceKind::kAuto) device = BuiltDevices().front();
  switch (device) {
    case DeviceKind::kCpu: {
      CpuBackendOptions cpu;
      cpu.num_threads = options.num_threads;
      return CreateCpuBackend(config, weights, dispatch, cpu);
    }
    case DeviceKind::kCuda:
      // The CUDA backend's branch goes here, under its build option.
      return absl::FailedPreconditionError("this build has no CUDA backend; use cpu");
    case DeviceKind::kAuto:
      break;
  }
  return absl::InvalidArgumentError("unknown device");
}

}  // namespace switchserve
