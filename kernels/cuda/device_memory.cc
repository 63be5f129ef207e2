#include "kernels/cuda/device_memory.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace switchserve::cuda {

absl::Status CudaStatus(cudaError_t error, std::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();  // clear it
  const std::string message = absl::StrCat(std::string(what), ": ", cudaGetErrorName(error), " (",
                                           cudaGetErrorString(error), ")");
  if (error == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    Free();
    data_ = other.data_;
    bytes_ = other.bytes_;
    other.data_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

absl::Status DeviceBuffer::Grow(size_t bytes, bool* moved) {
  if (moved != nullptr) *moved = false;
  if (bytes <= bytes_ && data_ != nullptr) return absl::OkStatus();
  Free();
  void* p = nullptr;
  SWITCHSERVE_CUDA_RETURN_IF_ERROR(cudaMalloc(&p, bytes > 0 ? bytes : 1),
                                   absl::StrCat("cudaMalloc of ", bytes, " bytes"));
  data_ = p;
  bytes_ = bytes;
  if (moved != nullptr) *moved = true;
  return absl::OkStatus();
}

absl::Status DeviceBuffer::Upload(const void* data, size_t bytes) {
  if (bytes_ != bytes) Free();
  if (absl::Status s = Grow(bytes); !s.ok()) return s;
  if (bytes == 0) return absl::OkStatus();
  SWITCHSERVE_CUDA_RETURN_IF_ERROR(cudaMemcpy(data_, data, bytes, cudaMemcpyHostToDevice),
                                   "upload");
  // From pageable memory cudaMemcpy may return once the bytes are staged,
  // before they reach the device; kernels on a non-blocking stream (the
  // backend's) are not ordered after it, so wait for the copy to land.
  return CudaStatus(cudaDeviceSynchronize(), "upload");
}

void DeviceBuffer::Free() {
  if (data_ != nullptr) cudaFree(data_);
  data_ = nullptr;
  bytes_ = 0;
}

PinnedBuffer::~PinnedBuffer() {
  if (data_ != nullptr) cudaFreeHost(data_);
}

absl::Status PinnedBuffer::Grow(size_t bytes) {
  if (bytes <= bytes_ && data_ != nullptr) return absl::OkStatus();
  if (data_ != nullptr) cudaFreeHost(data_);
  data_ = nullptr;
  bytes_ = 0;
  void* p = nullptr;
  SWITCHSERVE_CUDA_RETURN_IF_ERROR(cudaMallocHost(&p, bytes > 0 ? bytes : 1),
                                   absl::StrCat("cudaMallocHost of ", bytes, " bytes"));
  data_ = static_cast<char*>(p);
  bytes_ = bytes;
  return absl::OkStatus();
}

}  // namespace switchserve::cuda
