// Streams, events and copies of the SIMT executor. Work queued on any stream
// goes into one issue-ordered queue that runs at the next synchronisation, on
// the thread that synchronises: issue order is a valid order for every
// stream/event dependency, and nothing queued runs before the host asks for
// it, so a result read without synchronising is still unwritten (0xff bytes)
// in tests. Copies follow CUDA's host-synchronisation rules: to pageable host
// memory they complete before returning; from pageable host memory the source
// is read at the call.
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstring>
#include <deque>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/simt_internal.h"

struct CUstream_st {
  unsigned flags = 0;
};
struct CUevent_st {
  unsigned flags = 0;
  bool recorded = false;
  bool completed = false;
  std::chrono::steady_clock::time_point time;
};

namespace simt::detail {
namespace {

struct Queue {
  std::mutex mu;  // guards `work`, `streams`, `events`
  std::deque<std::function<cudaError_t()>> work;
  std::set<cudaStream_t> streams;
  std::set<cudaEvent_t> events;
  std::mutex run_mu;  // one thread runs queued work at a time
};
Queue& TheQueue() {
  static Queue* queue = new Queue;  // never destroyed
  return *queue;
}

bool IsValidEvent(cudaEvent_t event) {
  Queue& queue = TheQueue();
  std::lock_guard<std::mutex> lock(queue.mu);
  return queue.events.count(event) != 0;
}

const char* KindName(cudaMemcpyKind kind) {
  switch (kind) {
    case cudaMemcpyHostToHost:
      return "cudaMemcpyHostToHost";
    case cudaMemcpyHostToDevice:
      return "cudaMemcpyHostToDevice";
    case cudaMemcpyDeviceToHost:
      return "cudaMemcpyDeviceToHost";
    case cudaMemcpyDeviceToDevice:
      return "cudaMemcpyDeviceToDevice";
    case cudaMemcpyDefault:
      return "cudaMemcpyDefault";
  }
  return "an unknown cudaMemcpyKind";
}

bool IsDeviceSide(const void* p) {
  const MemoryKind kind = FindRegion(p).kind;
  return kind == MemoryKind::kDevice || kind == MemoryKind::kFreedDevice;
}
bool IsPageableHost(const void* p) { return FindRegion(p).kind == MemoryKind::kUnknown; }

// Checks one side of a copy: `device` says which side the kind names.
std::string CheckSide(const char* side, const void* p, size_t count, bool device) {
  if (device) {
    const std::string why = CheckDeviceRange(p, static_cast<int64_t>(count));
    return why.empty() ? "" : std::string(side) + " " + why;
  }
  if (IsDeviceSide(p)) {
    return std::string(side) + " " + FormatPointer(p) + " is " + DescribeRegion(p) +
           ", but the copy kind says host memory";
  }
  return "";
}

// Validates a copy's pointers against its kind; reports and returns an error.
cudaError_t CheckCopy(const char* api, void* dst, const void* src, size_t count,
                      cudaMemcpyKind kind) {
  bool dst_device = false;
  bool src_device = false;
  switch (kind) {
    case cudaMemcpyHostToHost:
      break;
    case cudaMemcpyHostToDevice:
      dst_device = true;
      break;
    case cudaMemcpyDeviceToHost:
      src_device = true;
      break;
    case cudaMemcpyDeviceToDevice:
      dst_device = src_device = true;
      break;
    case cudaMemcpyDefault:
      dst_device = IsDeviceSide(dst);
      src_device = IsDeviceSide(src);
      break;
    default:
      return Report(cudaErrorInvalidMemcpyDirection,
                    std::string(api) + ": unknown cudaMemcpyKind " + std::to_string(kind));
  }
  if (count == 0) return cudaSuccess;
  std::string why = CheckSide("dst", dst, count, dst_device);
  if (why.empty()) why = CheckSide("src", src, count, src_device);
  if (why.empty()) return cudaSuccess;
  return Report(cudaErrorInvalidValue,
                absl::StrCat(api, "(dst=", FormatPointer(dst), ", src=", FormatPointer(src), ", ",
                             count, " bytes, ", KindName(kind), "): ", why));
}

cudaError_t CheckStream(const char* api, cudaStream_t stream) {
  if (IsValidStream(stream)) return cudaSuccess;
  return Report(cudaErrorInvalidResourceHandle,
                std::string(api) + ": " + FormatPointer(stream) + " is not a live stream");
}

cudaError_t Synchronized(cudaError_t code) {
  const cudaError_t pending = Drain();
  if (code == cudaSuccess) code = pending;
  SetLastError(code);
  return code;
}

}  // namespace

bool IsValidStream(cudaStream_t stream) {
  if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread) {
    return true;
  }
  Queue& queue = TheQueue();
  std::lock_guard<std::mutex> lock(queue.mu);
  return queue.streams.count(stream) != 0;
}

void Enqueue(cudaStream_t /*stream*/, std::function<cudaError_t()> work) {
  Queue& queue = TheQueue();
  std::lock_guard<std::mutex> lock(queue.mu);
  queue.work.push_back(std::move(work));
}

cudaError_t Drain() {
  // Queued work that synchronises (a host function calling cudaMemcpy, which
  // CUDA forbids) would wait for itself.
  thread_local bool draining = false;
  if (draining) {
    return Report(cudaErrorNotPermitted,
                  "a synchronising CUDA call inside queued work (a cudaLaunchHostFunc "
                  "callback may not call CUDA)");
  }
  Queue& queue = TheQueue();
  std::lock_guard<std::mutex> run_lock(queue.run_mu);
  draining = true;
  for (;;) {
    std::function<cudaError_t()> work;
    {
      std::lock_guard<std::mutex> lock(queue.mu);
      if (queue.work.empty()) break;
      work = std::move(queue.work.front());
      queue.work.pop_front();
    }
    const cudaError_t code = work();
    if (code != cudaSuccess) SetPendingError(code);
  }
  draining = false;
  return TakePendingError();
}

}  // namespace simt::detail

// ---- CUDA runtime API: streams, events, copies ----------------------------------

using simt::detail::Drain;
using simt::detail::Enqueue;
using simt::detail::Report;

extern "C" {

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  if (stream == nullptr) return Report(cudaErrorInvalidValue, "cudaStreamCreate: null pointer");
  *stream = new CUstream_st{flags};
  simt::detail::Queue& queue = simt::detail::TheQueue();
  std::lock_guard<std::mutex> lock(queue.mu);
  queue.streams.insert(*stream);
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  return cudaStreamCreateWithFlags(stream, cudaStreamDefault);
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread) {
    return Report(cudaErrorInvalidResourceHandle, "cudaStreamDestroy: a default stream");
  }
  if (cudaError_t e = simt::detail::CheckStream("cudaStreamDestroy", stream)) return e;
  const cudaError_t pending = Drain();  // its queued work still runs, as on a GPU
  simt::detail::Queue& queue = simt::detail::TheQueue();
  {
    std::lock_guard<std::mutex> lock(queue.mu);
    queue.streams.erase(stream);
  }
  delete stream;
  return pending;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  if (cudaError_t e = simt::detail::CheckStream("cudaStreamSynchronize", stream)) return e;
  return simt::detail::Synchronized(cudaSuccess);
}

// A stream is never "not ready" here: querying runs its work, so that polling
// loops finish.
cudaError_t cudaStreamQuery(cudaStream_t stream) {
  if (cudaError_t e = simt::detail::CheckStream("cudaStreamQuery", stream)) return e;
  return simt::detail::Synchronized(cudaSuccess);
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int /*flags*/) {
  if (cudaError_t e = simt::detail::CheckStream("cudaStreamWaitEvent", stream)) return e;
  if (!simt::detail::IsValidEvent(event)) {
    return Report(cudaErrorInvalidResourceHandle, "cudaStreamWaitEvent: not a live event");
  }
  return cudaSuccess;  // one issue-ordered queue: the event's work is already ahead
}

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* user_data) {
  if (cudaError_t e = simt::detail::CheckStream("cudaLaunchHostFunc", stream)) return e;
  Enqueue(stream, [fn, user_data] {
    fn(user_data);
    return cudaSuccess;
  });
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() { return simt::detail::Synchronized(cudaSuccess); }

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  if (event == nullptr) return Report(cudaErrorInvalidValue, "cudaEventCreate: null pointer");
  *event = new CUevent_st{flags, false, false, {}};
  simt::detail::Queue& queue = simt::detail::TheQueue();
  std::lock_guard<std::mutex> lock(queue.mu);
  queue.events.insert(*event);
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  return cudaEventCreateWithFlags(event, cudaEventDefault);
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  if (!simt::detail::IsValidEvent(event)) {
    return Report(cudaErrorInvalidResourceHandle, "cudaEventDestroy: not a live event");
  }
  const cudaError_t pending = Drain();  // queued records of it still run
  simt::detail::Queue& queue = simt::detail::TheQueue();
  {
    std::lock_guard<std::mutex> lock(queue.mu);
    queue.events.erase(event);
  }
  delete event;
  return pending;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (cudaError_t e = simt::detail::CheckStream("cudaEventRecord", stream)) return e;
  if (!simt::detail::IsValidEvent(event)) {
    return Report(cudaErrorInvalidResourceHandle, "cudaEventRecord: not a live event");
  }
  event->recorded = true;
  event->completed = false;
  Enqueue(stream, [event] {
    event->completed = true;
    event->time = std::chrono::steady_clock::now();
    return cudaSuccess;
  });
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  if (!simt::detail::IsValidEvent(event)) {
    return Report(cudaErrorInvalidResourceHandle, "cudaEventSynchronize: not a live event");
  }
  return simt::detail::Synchronized(cudaSuccess);
}

cudaError_t cudaEventQuery(cudaEvent_t event) { return cudaEventSynchronize(event); }

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (ms == nullptr || !simt::detail::IsValidEvent(start) || !simt::detail::IsValidEvent(end)) {
    return Report(cudaErrorInvalidValue, "cudaEventElapsedTime: bad arguments");
  }
  if (!start->completed || !end->completed) return cudaErrorNotReady;
  *ms = std::chrono::duration<float, std::milli>(end->time - start->time).count();
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, cudaMemcpyKind kind) {
  if (cudaError_t e = simt::detail::CheckCopy("cudaMemcpy", dst, src, count, kind)) return e;
  const cudaError_t pending = Drain();  // synchronous: earlier work first
  if (count != 0) std::memcpy(dst, src, count);
  return pending;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  if (cudaError_t e = simt::detail::CheckStream("cudaMemcpyAsync", stream)) return e;
  if (cudaError_t e = simt::detail::CheckCopy("cudaMemcpyAsync", dst, src, count, kind)) return e;
  if (count == 0) return cudaSuccess;
  if (simt::detail::IsPageableHost(dst)) {
    // To pageable host memory the call returns once the copy is done.
    const cudaError_t pending = Drain();
    std::memcpy(dst, src, count);
    return pending;
  }
  if (simt::detail::IsPageableHost(src)) {
    // From pageable host memory the source is staged at the call.
    const char* bytes = static_cast<const char*>(src);
    Enqueue(stream, [dst, staged = std::vector<char>(bytes, bytes + count)] {
      std::memcpy(dst, staged.data(), staged.size());
      return cudaSuccess;
    });
    return cudaSuccess;
  }
  Enqueue(stream, [dst, src, count] {
    std::memcpy(dst, src, count);
    return cudaSuccess;
  });
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* dev_ptr, int value, size_t count, cudaStream_t stream) {
  if (cudaError_t e = simt::detail::CheckStream("cudaMemsetAsync", stream)) return e;
  if (count == 0) return cudaSuccess;
  const std::string why = simt::detail::CheckDeviceRange(dev_ptr, static_cast<int64_t>(count));
  if (!why.empty()) {
    return Report(cudaErrorInvalidValue,
                  absl::StrCat("cudaMemset(", simt::detail::FormatPointer(dev_ptr), ", ", count,
                               " bytes): ", why));
  }
  Enqueue(stream, [dev_ptr, value, count] {
    std::memset(dev_ptr, value, count);
    return cudaSuccess;
  });
  return cudaSuccess;
}

cudaError_t cudaMemset(void* dev_ptr, int value, size_t count) {
  if (cudaError_t e = cudaMemsetAsync(dev_ptr, value, count, nullptr)) return e;
  return Drain();
}

}  // extern "C"
