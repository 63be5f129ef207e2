// Launches and the device of the SIMT executor: validation of every launch
// (configuration, shared memory, pointer arguments) before it is queued, and
// the device queries of the CUDA runtime API for one emulated device shaped
// like an H100 (compute capability 9.0, 32-lane warps, 1024 threads a block).
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/simt_control.h"
#include "kernels/cuda/simt_internal.h"

namespace simt::detail {
namespace {

constexpr int kMaxThreadsPerBlock = 1024;
constexpr int kDefaultSharedBytes = 48 << 10;  // without cudaFuncSetAttribute
constexpr int kOptinSharedBytes = 227 << 10;   // sm_90's opt-in limit

struct FunctionAttributes {
  std::mutex mu;
  std::map<const void*, int> max_dynamic_shared;
};
FunctionAttributes& Attributes() {
  static FunctionAttributes* attributes = new FunctionAttributes;  // never destroyed
  return *attributes;
}

int MaxDynamicShared(const void* kernel) {
  FunctionAttributes& attributes = Attributes();
  std::lock_guard<std::mutex> lock(attributes.mu);
  auto it = attributes.max_dynamic_shared.find(kernel);
  return it == attributes.max_dynamic_shared.end() ? kDefaultSharedBytes : it->second;
}

std::string Dims(dim3 d) { return absl::StrCat("(", d.x, ",", d.y, ",", d.z, ")"); }

// "" when the configuration is one a GPU accepts.
std::string CheckConfiguration(dim3 grid, dim3 block) {
  const int64_t threads = int64_t{block.x} * block.y * block.z;
  if (block.x == 0 || block.y == 0 || block.z == 0 || block.z > 64 ||
      threads > kMaxThreadsPerBlock) {
    return absl::StrCat("block ", Dims(block), ": 1 to 1024 threads, z at most 64");
  }
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 2147483647u || grid.y > 65535 ||
      grid.z > 65535) {
    return absl::StrCat("grid ", Dims(grid), ": x in [1, 2^31-1], y and z in [1, 65535]");
  }
  return "";
}

}  // namespace

cudaError_t EnqueueLaunch(const char* name, const void* kernel, dim3 grid, dim3 block,
                          size_t shared_bytes, cudaStream_t stream, bool dependent,
                          KernelBody* body, const PointerArgument* pointers, int n_pointers) {
  auto launch = std::make_shared<KernelLaunch>();
  launch->name = name;
  launch->dependent = dependent;
  launch->grid = grid;
  launch->block = block;
  launch->shared_bytes = shared_bytes;
  launch->body.reset(body);
  const std::string prefix = absl::StrCat("kernel '", launch->name, "'");
  auto fail = [&](cudaError_t code, const std::string& what) {
    code = Report(code, absl::StrCat(prefix, ": ", what));
    SetLastError(code);
    return code;
  };
  if (!IsValidStream(stream)) {
    return fail(cudaErrorInvalidResourceHandle,
                absl::StrCat("stream ", FormatPointer(stream), " is not live"));
  }
  if (const std::string why = CheckConfiguration(grid, block); !why.empty()) {
    return fail(cudaErrorInvalidConfiguration, why);
  }
  const int max_shared = MaxDynamicShared(kernel);
  if (shared_bytes > static_cast<size_t>(max_shared)) {
    return fail(
        cudaErrorInvalidValue,
        absl::StrCat(shared_bytes, " bytes of dynamic shared memory; the limit is ", max_shared,
                     max_shared == kDefaultSharedBytes
                         ? " without cudaFuncSetAttribute(MaxDynamicSharedMemorySize)"
                         : " set by cudaFuncSetAttribute"));
  }
  for (int i = 0; i < n_pointers; ++i) {
    const PointerArgument& arg = pointers[i];
    if (arg.value == nullptr) continue;
    const MemoryKind kind = FindRegion(arg.value).kind;
    if (kind == MemoryKind::kDevice) continue;
    const cudaError_t code =
        kind == MemoryKind::kFreedDevice ? cudaErrorIllegalAddress : cudaErrorInvalidValue;
    return fail(code, absl::StrCat("argument ", arg.index, " (", Demangle(arg.type), ") = ",
                                   FormatPointer(arg.value), " is ", DescribeRegion(arg.value),
                                   "; pointer arguments of a kernel point into live device "
                                   "memory"));
  }
  Enqueue(stream, [launch] { return RunGrid(*launch); });
  return cudaSuccess;
}

}  // namespace simt::detail

// ---- CUDA runtime API: device and functions ------------------------------------

using simt::detail::Report;

extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return Report(cudaErrorInvalidValue, "cudaGetDeviceCount: null");
  *count = 1;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return Report(cudaErrorInvalidValue, "cudaGetDevice: null");
  *device = 0;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (device != 0) {
    return Report(cudaErrorInvalidDevice,
                  absl::StrCat("cudaSetDevice(", device, "): the executor has device 0 only"));
  }
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (prop == nullptr || device != 0) {
    return Report(cudaErrorInvalidDevice, "cudaGetDeviceProperties: device 0 only");
  }
  std::memset(prop, 0, sizeof(*prop));
  std::snprintf(prop->name, sizeof(prop->name), "switchserve SIMT executor (CPU, emulated)");
  size_t free_bytes = 0;
  cudaMemGetInfo(&free_bytes, &prop->totalGlobalMem);
  prop->sharedMemPerBlock = simt::detail::kDefaultSharedBytes;
  prop->sharedMemPerBlockOptin = simt::detail::kOptinSharedBytes;
  prop->sharedMemPerMultiprocessor = 228 << 10;
  prop->regsPerBlock = 65536;
  prop->warpSize = simt::kWarp;
  prop->maxThreadsPerBlock = simt::detail::kMaxThreadsPerBlock;
  prop->maxThreadsDim[0] = 1024;
  prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = 2147483647;
  prop->maxGridSize[1] = 65535;
  prop->maxGridSize[2] = 65535;
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = simt::detail::HostThreads();
  prop->maxThreadsPerMultiProcessor = 2048;
  prop->unifiedAddressing = 1;
  prop->canMapHostMemory = 1;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (value == nullptr || device != 0) {
    return Report(cudaErrorInvalidDevice, "cudaDeviceGetAttribute: device 0 only");
  }
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock:
      *value = prop.maxThreadsPerBlock;
      return cudaSuccess;
    case cudaDevAttrWarpSize:
      *value = prop.warpSize;
      return cudaSuccess;
    case cudaDevAttrMultiProcessorCount:
      *value = prop.multiProcessorCount;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMajor:
      *value = prop.major;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor:
      *value = prop.minor;
      return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlock:
      *value = static_cast<int>(prop.sharedMemPerBlock);
      return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = static_cast<int>(prop.sharedMemPerBlockOptin);
      return cudaSuccess;
    default:
      return Report(cudaErrorInvalidValue,
                    absl::StrCat("cudaDeviceGetAttribute: attribute ", static_cast<int>(attr),
                                 " is not emulated"));
  }
}

cudaError_t cudaDeviceReset() { return cudaDeviceSynchronize(); }

cudaError_t cudaRuntimeGetVersion(int* version) {
  if (version == nullptr) return cudaErrorInvalidValue;
  *version = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int* version) {
  if (version == nullptr) return cudaErrorInvalidValue;
  *version = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) {
    return cudaSuccess;  // carve-out and other hints change nothing here
  }
  if (value < 0 || value > simt::detail::kOptinSharedBytes) {
    return Report(cudaErrorInvalidValue,
                  absl::StrCat("cudaFuncSetAttribute(MaxDynamicSharedMemorySize, ", value,
                               "): the limit is ", simt::detail::kOptinSharedBytes));
  }
  simt::detail::FunctionAttributes& attributes = simt::detail::Attributes();
  std::lock_guard<std::mutex> lock(attributes.mu);
  attributes.max_dynamic_shared[func] = value;
  return cudaSuccess;
}

}  // extern "C"
