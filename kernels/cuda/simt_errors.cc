// Error reporting of the SIMT executor: abort with a message by default, or
// collect messages under a ScopedErrorCapture; the CUDA error state
// (cudaGetLastError, cudaGetErrorString, cudaGetErrorName).
#include <cuda_runtime_api.h>
#include <cxxabi.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/cuda/simt_control.h"
#include "kernels/cuda/simt_internal.h"

namespace simt::detail {
namespace {

struct ErrorState {
  std::mutex mu;
  bool capturing = false;
  std::vector<std::string> messages;
  cudaError_t pending = cudaSuccess;  // first error of queued work
};
ErrorState& Errors() {
  static ErrorState* state = new ErrorState;  // never destroyed: used by exiting threads
  return *state;
}

thread_local cudaError_t last_error = cudaSuccess;

}  // namespace

cudaError_t Report(cudaError_t code, const std::string& message) {
  SetLastError(code);  // as every failing runtime call does
  ErrorState& errors = Errors();
  {
    std::lock_guard<std::mutex> lock(errors.mu);
    if (errors.capturing) {
      errors.messages.push_back(message);
      return code;
    }
  }
  std::fprintf(stderr, "simt: %s\n", message.c_str());
  std::fflush(stderr);
  std::abort();
}

void SetLastError(cudaError_t code) {
  if (code != cudaSuccess) last_error = code;
}
cudaError_t TakeLastError() {
  const cudaError_t code = last_error;
  last_error = cudaSuccess;
  return code;
}
cudaError_t PeekLastError() { return last_error; }

void SetPendingError(cudaError_t code) {
  ErrorState& errors = Errors();
  std::lock_guard<std::mutex> lock(errors.mu);
  if (errors.pending == cudaSuccess) errors.pending = code;
}
cudaError_t TakePendingError() {
  ErrorState& errors = Errors();
  std::lock_guard<std::mutex> lock(errors.mu);
  const cudaError_t code = errors.pending;
  errors.pending = cudaSuccess;
  return code;
}

std::string FormatPointer(const void* p) {
  char text[32];
  std::snprintf(text, sizeof(text), "%p", p);
  return text;
}

std::string Demangle(const char* mangled) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> name(
      abi::__cxa_demangle(mangled, nullptr, nullptr, &status), std::free);
  return status == 0 && name != nullptr ? std::string(name.get()) : std::string(mangled);
}

}  // namespace simt::detail

namespace simt {

ScopedErrorCapture::ScopedErrorCapture() {
  detail::ErrorState& errors = detail::Errors();
  std::lock_guard<std::mutex> lock(errors.mu);
  if (errors.capturing) {
    std::fprintf(stderr, "simt: nested ScopedErrorCapture\n");
    std::abort();
  }
  errors.capturing = true;
  errors.messages.clear();
}

ScopedErrorCapture::~ScopedErrorCapture() {
  detail::ErrorState& errors = detail::Errors();
  std::lock_guard<std::mutex> lock(errors.mu);
  errors.capturing = false;
  errors.messages.clear();
  errors.pending = cudaSuccess;
}

std::vector<std::string> ScopedErrorCapture::messages() const {
  detail::ErrorState& errors = detail::Errors();
  std::lock_guard<std::mutex> lock(errors.mu);
  return errors.messages;
}

std::string ScopedErrorCapture::Text() const {
  std::string text;
  for (const std::string& message : messages()) text += message + "\n";
  return text;
}

}  // namespace simt

// ---- CUDA runtime API: error state -------------------------------------------

extern "C" {

cudaError_t cudaGetLastError() { return simt::detail::TakeLastError(); }
cudaError_t cudaPeekAtLastError() { return simt::detail::PeekLastError(); }

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevicePointer:
      return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection:
      return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle:
      return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady:
      return "cudaErrorNotReady";
    case cudaErrorIllegalAddress:
      return "cudaErrorIllegalAddress";
    case cudaErrorLaunchFailure:
      return "cudaErrorLaunchFailure";
    case cudaErrorLaunchOutOfResources:
      return "cudaErrorLaunchOutOfResources";
    case cudaErrorNotSupported:
      return "cudaErrorNotSupported";
    case cudaErrorNotPermitted:
      return "cudaErrorNotPermitted";
    default:
      return "cudaErrorUnknown";
  }
}

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer:
      return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection:
      return "invalid copy direction for memcpy";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle:
      return "invalid resource handle";
    case cudaErrorNotReady:
      return "device not ready";
    case cudaErrorIllegalAddress:
      return "an illegal memory access was encountered";
    case cudaErrorLaunchFailure:
      return "unspecified launch failure";
    case cudaErrorLaunchOutOfResources:
      return "too many resources requested for launch";
    case cudaErrorNotSupported:
      return "operation not supported";
    case cudaErrorNotPermitted:
      return "operation not permitted";
    default:
      return "unknown error";
  }
}

}  // extern "C"
