// Device and pinned host memory of the CUDA backend, owned RAII-style, and
// CUDA errors as absl::Status. Internal to the backend (kernels/cuda/).
#ifndef SWITCHSERVE_KERNELS_CUDA_DEVICE_MEMORY_H_
#define SWITCHSERVE_KERNELS_CUDA_DEVICE_MEMORY_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "absl/status/status.h"

namespace switchserve::cuda {

// OK for cudaSuccess; otherwise INTERNAL (RESOURCE_EXHAUSTED for
// cudaErrorMemoryAllocation) naming `what` and CUDA's error. Clears the
// runtime's last error.
absl::Status CudaStatus(cudaError_t error, std::string_view what);

// Returns the status of `expr` (a cudaError_t) from the enclosing function
// unless it is cudaSuccess.
#define SWITCHSERVE_CUDA_RETURN_IF_ERROR(expr, what)                                              \
  do {                                                                                            \
    if (const cudaError_t switchserve_cuda_error = (expr); switchserve_cuda_error != cudaSuccess) \
      return ::switchserve::cuda::CudaStatus(switchserve_cuda_error, what);                       \
  } while (0)

// One device allocation. Grow() replaces it by a larger one (the contents are
// not kept): buffers are sized for the largest step so far.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() { Free(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept { *this = static_cast<DeviceBuffer&&>(other); }
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;

  // At least `bytes` (never less than held). Returns whether it reallocated
  // in `*moved` (when not null).
  absl::Status Grow(size_t bytes, bool* moved = nullptr);
  // Exactly `bytes` and `data` copied in (synchronously).
  absl::Status Upload(const void* data, size_t bytes);
  void Free();

  void* get() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Page-locked host memory, for the step's upload and download.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer();
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  absl::Status Grow(size_t bytes);
  char* get() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  char* data_ = nullptr;
  size_t bytes_ = 0;
};

// Offsets of arrays packed into one buffer, each aligned to 16 bytes.
class PackedLayout {
 public:
  // Reserves `count` elements of `element_bytes`; returns the byte offset.
  size_t Add(size_t count, size_t element_bytes) {
    const size_t offset = (bytes_ + 15) / 16 * 16;
    bytes_ = offset + count * element_bytes;
    return offset;
  }
  size_t bytes() const { return (bytes_ + 15) / 16 * 16; }

 private:
  size_t bytes_ = 0;
};

}  // namespace switchserve::cuda

#endif  // SWITCHSERVE_KERNELS_CUDA_DEVICE_MEMORY_H_
