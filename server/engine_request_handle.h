// One submitted engine request, as a front end's call holds it: submission
// and cancellation from any thread. Cancel may arrive (from a gRPC or HTTP
// thread, when the client goes away) before the engine accepted the request;
// it is then forwarded right after submission.
//
// Thread-safe.
#ifndef SWITCHSERVE_SERVER_ENGINE_REQUEST_HANDLE_H_
#define SWITCHSERVE_SERVER_ENGINE_REQUEST_HANDLE_H_

#include <mutex>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "engine/runtime/generation_engine.h"

namespace switchserve {

class EngineRequestHandle {
 public:
  // The engine's Submit status (RESOURCE_EXHAUSTED: queue full; UNAVAILABLE:
  // stopping). On error the request's sink gets no update.
  absl::Status Submit(GenerationEngine* engine, GenerationRequest request) {
    auto id = engine->Submit(std::move(request));
    std::lock_guard<std::mutex> lock(mu_);
    engine_ = engine;
    if (!id.ok()) return id.status();
    id_ = *id;
    if (cancel_requested_) engine_->Cancel(*id_);
    return absl::OkStatus();
  }
  void Cancel() {
    std::lock_guard<std::mutex> lock(mu_);
    cancel_requested_ = true;
    if (id_) engine_->Cancel(*id_);
  }

 private:
  std::mutex mu_;
  GenerationEngine* engine_ = nullptr;
  std::optional<RequestId> id_;
  bool cancel_requested_ = false;
};

}  // namespace switchserve

#endif  // SWITCHSERVE_SERVER_ENGINE_REQUEST_HANDLE_H_
