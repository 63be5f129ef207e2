// Device memory of the SIMT executor: cudaMalloc'd blocks are host heap
// blocks of exactly the requested size (so ASan sees an overrun of a device
// buffer), filled with 0xff bytes (NaN as float, -1 as int) so that reading
// memory nobody wrote shows up; every live, freed and pinned block is tracked
// so that launches and copies can say what a pointer points into. Freed
// blocks stay in a quarantine (poisoned: 0xff, or for ASan unaddressable)
// before they go back to the heap, so that an address in a freed block is a
// use after free, never host memory that reuses it.
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/simt_control.h"
#include "kernels/cuda/simt_internal.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

namespace simt::detail {
namespace {

constexpr size_t kDeviceAlignment = 256;  // cudaMalloc's guarantee
constexpr int64_t kEmulatedMemoryBytes = int64_t{80} << 30;
constexpr int64_t kQuarantineBytes = int64_t{64} << 20;

struct Memory {
  std::mutex mu;
  std::map<const char*, MemoryRegion> device;  // live cudaMalloc blocks, by base
  std::map<const char*, MemoryRegion> freed;   // freed ones, while in quarantine
  std::deque<const char*> quarantine;          // freed bases, oldest first
  int64_t quarantine_bytes = 0;
  std::map<const char*, MemoryRegion> pinned;  // cudaMallocHost / cudaHostRegister
  int64_t next_id = 1;
  int64_t bytes_in_use = 0;
};
Memory& TheMemory() {
  static Memory* memory = new Memory;  // never destroyed
  return *memory;
}

// The region of `regions` containing p (one past the end included).
const MemoryRegion* Containing(const std::map<const char*, MemoryRegion>& regions, const void* p) {
  const char* c = static_cast<const char*>(p);
  auto it = regions.upper_bound(c);
  if (it == regions.begin()) return nullptr;
  --it;
  const MemoryRegion& region = it->second;
  return c <= region.base + region.size ? &region : nullptr;
}

void Poison(const char* base, int64_t size) {
  std::memset(const_cast<char*>(base), 0xff, static_cast<size_t>(size));
#if defined(__SANITIZE_ADDRESS__)
  ASAN_POISON_MEMORY_REGION(base, size);
#endif
}

// Returns the oldest quarantined blocks to the heap while over budget.
void TrimQuarantine(Memory& memory) {
  while (memory.quarantine_bytes > kQuarantineBytes) {
    const char* base = memory.quarantine.front();
    memory.quarantine.pop_front();
    auto it = memory.freed.find(base);
    memory.quarantine_bytes -= it->second.size;
#if defined(__SANITIZE_ADDRESS__)
    ASAN_UNPOISON_MEMORY_REGION(base, it->second.size);
#endif
    memory.freed.erase(it);
    std::free(const_cast<char*>(base));
  }
}

std::string DescribeRegionLocked(const MemoryRegion& region, const void* p) {
  const int64_t offset = static_cast<const char*>(p) - region.base;
  const std::string where = absl::StrCat("#", region.id, " (", region.size, " bytes) at +", offset);
  switch (region.kind) {
    case MemoryKind::kDevice:
      return "device allocation " + where;
    case MemoryKind::kFreedDevice:
      return "device allocation " + where + ", freed by cudaFree (use after free)";
    case MemoryKind::kPinnedHost:
      return "pinned host allocation " + where;
    case MemoryKind::kUnknown:
      break;
  }
  return "host memory";
}

}  // namespace

MemoryRegion FindRegion(const void* p) {
  Memory& memory = TheMemory();
  std::lock_guard<std::mutex> lock(memory.mu);
  if (const MemoryRegion* r = Containing(memory.device, p)) return *r;
  if (const MemoryRegion* r = Containing(memory.pinned, p)) return *r;
  if (const MemoryRegion* r = Containing(memory.freed, p)) return *r;
  return MemoryRegion{};
}

std::string DescribeRegion(const void* p) {
  const MemoryRegion region = FindRegion(p);
  if (region.kind == MemoryKind::kUnknown) {
    return "host memory (not a device allocation)";
  }
  return DescribeRegionLocked(region, p);
}

std::string CheckDeviceRange(const void* p, int64_t bytes) {
  const MemoryRegion region = FindRegion(p);
  if (region.kind != MemoryKind::kDevice) {
    return absl::StrCat(FormatPointer(p), " is ", DescribeRegion(p));
  }
  const int64_t offset = static_cast<const char*>(p) - region.base;
  if (offset + bytes > region.size) {
    return absl::StrCat("[", FormatPointer(p), ", +", bytes, " bytes) runs past the end of ",
                        DescribeRegionLocked(region, p));
  }
  return "";
}

}  // namespace simt::detail

namespace simt {

MemoryUsage DeviceMemoryInUse() {
  detail::Memory& memory = detail::TheMemory();
  std::lock_guard<std::mutex> lock(memory.mu);
  return MemoryUsage{static_cast<int64_t>(memory.device.size()), memory.bytes_in_use};
}

}  // namespace simt

// ---- CUDA runtime API: memory ------------------------------------------------

using simt::detail::MemoryKind;
using simt::detail::MemoryRegion;
using simt::detail::Report;

extern "C" {

cudaError_t cudaMalloc(void** dev_ptr, size_t size) {
  if (dev_ptr == nullptr) return Report(cudaErrorInvalidValue, "cudaMalloc: devPtr is null");
  *dev_ptr = nullptr;
  if (size == 0) return cudaSuccess;
  void* p = nullptr;
  if (posix_memalign(&p, simt::detail::kDeviceAlignment, size) != 0) {
    simt::detail::SetLastError(cudaErrorMemoryAllocation);
    return cudaErrorMemoryAllocation;
  }
  std::memset(p, 0xff, size);
  simt::detail::Memory& memory = simt::detail::TheMemory();
  std::lock_guard<std::mutex> lock(memory.mu);
  const char* base = static_cast<const char*>(p);
  const auto bytes = static_cast<int64_t>(size);
  memory.device[base] = MemoryRegion{MemoryKind::kDevice, base, bytes, memory.next_id++};
  memory.bytes_in_use += bytes;
  *dev_ptr = p;
  return cudaSuccess;
}

cudaError_t cudaFree(void* dev_ptr) {
  // cudaFree synchronises the device: queued work may still use the block.
  const cudaError_t pending = simt::detail::Drain();
  if (dev_ptr == nullptr) return pending;
  simt::detail::Memory& memory = simt::detail::TheMemory();
  std::unique_lock<std::mutex> lock(memory.mu);
  auto it = memory.device.find(static_cast<const char*>(dev_ptr));
  if (it == memory.device.end()) {
    lock.unlock();
    const std::string what = simt::detail::DescribeRegion(dev_ptr);
    return Report(cudaErrorInvalidDevicePointer,
                  absl::StrCat("cudaFree(", simt::detail::FormatPointer(dev_ptr),
                               "): not the start of a live device allocation; it is ", what));
  }
  MemoryRegion region = it->second;
  memory.device.erase(it);
  memory.bytes_in_use -= region.size;
  region.kind = MemoryKind::kFreedDevice;
  memory.freed[region.base] = region;
  memory.quarantine.push_back(region.base);
  memory.quarantine_bytes += region.size;
  simt::detail::Poison(region.base, region.size);
  simt::detail::TrimQuarantine(memory);
  return pending;
}

cudaError_t cudaHostAlloc(void** ptr, size_t size, unsigned int /*flags*/) {
  if (ptr == nullptr) return Report(cudaErrorInvalidValue, "cudaHostAlloc: pHost is null");
  *ptr = nullptr;
  if (size == 0) return cudaSuccess;
  void* p = nullptr;
  if (posix_memalign(&p, 4096, size) != 0) return cudaErrorMemoryAllocation;
  simt::detail::Memory& memory = simt::detail::TheMemory();
  std::lock_guard<std::mutex> lock(memory.mu);
  const char* base = static_cast<const char*>(p);
  memory.pinned[base] =
      MemoryRegion{MemoryKind::kPinnedHost, base, static_cast<int64_t>(size), memory.next_id++};
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** ptr, size_t size) { return cudaHostAlloc(ptr, size, 0); }

cudaError_t cudaFreeHost(void* ptr) {
  const cudaError_t pending = simt::detail::Drain();
  if (ptr == nullptr) return pending;
  simt::detail::Memory& memory = simt::detail::TheMemory();
  std::unique_lock<std::mutex> lock(memory.mu);
  auto it = memory.pinned.find(static_cast<const char*>(ptr));
  if (it == memory.pinned.end()) {
    lock.unlock();
    return Report(cudaErrorInvalidValue,
                  absl::StrCat("cudaFreeHost(", simt::detail::FormatPointer(ptr),
                               "): not a cudaMallocHost/cudaHostAlloc block"));
  }
  memory.pinned.erase(it);
  std::free(ptr);
  return pending;
}

cudaError_t cudaHostRegister(void* ptr, size_t size, unsigned int /*flags*/) {
  if (ptr == nullptr || size == 0) {
    return Report(cudaErrorInvalidValue, "cudaHostRegister: null pointer or zero size");
  }
  simt::detail::Memory& memory = simt::detail::TheMemory();
  std::lock_guard<std::mutex> lock(memory.mu);
  const char* base = static_cast<const char*>(ptr);
  // A negative id marks a registered (not allocated) block: cudaFreeHost refuses it.
  memory.pinned[base] =
      MemoryRegion{MemoryKind::kPinnedHost, base, static_cast<int64_t>(size), -memory.next_id++};
  return cudaSuccess;
}

cudaError_t cudaHostUnregister(void* ptr) {
  const cudaError_t pending = simt::detail::Drain();
  simt::detail::Memory& memory = simt::detail::TheMemory();
  std::lock_guard<std::mutex> lock(memory.mu);
  auto it = memory.pinned.find(static_cast<const char*>(ptr));
  if (it == memory.pinned.end() || it->second.id > 0) {
    return Report(cudaErrorInvalidValue,
                  absl::StrCat("cudaHostUnregister(", simt::detail::FormatPointer(ptr),
                               "): not a cudaHostRegister'ed block"));
  }
  memory.pinned.erase(it);
  return pending;
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* ptr) {
  if (attributes == nullptr) return Report(cudaErrorInvalidValue, "cudaPointerGetAttributes");
  *attributes = cudaPointerAttributes{};
  const MemoryRegion region = simt::detail::FindRegion(ptr);
  attributes->device = 0;
  switch (region.kind) {
    case MemoryKind::kDevice:
      attributes->type = cudaMemoryTypeDevice;
      attributes->devicePointer = const_cast<void*>(ptr);
      break;
    case MemoryKind::kPinnedHost:
      attributes->type = cudaMemoryTypeHost;
      attributes->devicePointer = const_cast<void*>(ptr);
      attributes->hostPointer = const_cast<void*>(ptr);
      break;
    case MemoryKind::kFreedDevice:
    case MemoryKind::kUnknown:
      attributes->type = cudaMemoryTypeUnregistered;
      attributes->hostPointer = const_cast<void*>(ptr);
      break;
  }
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  simt::detail::Memory& memory = simt::detail::TheMemory();
  std::lock_guard<std::mutex> lock(memory.mu);
  if (total_bytes != nullptr) *total_bytes = simt::detail::kEmulatedMemoryBytes;
  if (free_bytes != nullptr) {
    *free_bytes = static_cast<size_t>(simt::detail::kEmulatedMemoryBytes - memory.bytes_in_use);
  }
  return cudaSuccess;
}

}  // extern "C"
