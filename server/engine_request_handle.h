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
#include <vector>

#include "absl/status/status.h"
#include "engine/runtime/generation_engine.h"

namespace switchserve {

class EngineRequestHandle {
 public:
  // The engine's Submit status (RESOURCE_EXHAUSTED: queue full; UNAVAILABLE:
  // stopping). On error the request's sink gets no update.
  absl::Status Submit(GenerationEngine* engine, GenerationRequest request) {
    auto id = engine->Submit(std::move(request));
    if (!id.ok()) return id.status();
    Accepted(engine, *id);
    return absl::OkStatus();
  }
  // Several requests, all queued or none (GenerationEngine::SubmitAll):
  // handles[i] holds requests[i]. On error no request's sink gets an update.
  static absl::Status SubmitAll(GenerationEngine* engine,
                                const std::vector<EngineRequestHandle*>& handles,
                                std::vector<GenerationRequest> requests) {
    auto ids = engine->SubmitAll(std::move(requests));
    if (!ids.ok()) return ids.status();
    for (size_t i = 0; i < handles.size(); ++i) handles[i]->Accepted(engine, (*ids)[i]);
    return absl::OkStatus();
  }
  // `cause` tells the engine why (the call then ends CANCELLED,
  // DEADLINE_EXCEEDED or UNAVAILABLE); the first cause given is kept.
  void Cancel(CancelCause cause = CancelCause::kClient) {
    std::lock_guard<std::mutex> lock(mu_);
    if (cancel_requested_ == CancelCause::kNone) cancel_requested_ = cause;
    if (id_) engine_->Cancel(*id_, cause);
  }

 private:
  // The engine queued the request as `id`: a Cancel that came first goes to
  // it now.
  void Accepted(GenerationEngine* engine, RequestId id) {
    std::lock_guard<std::mutex> lock(mu_);
    engine_ = engine;
    id_ = id;
    if (cancel_requested_ != CancelCause::kNone) engine_->Cancel(*id_, cancel_requested_);
  }

  std::mutex mu_;
  GenerationEngine* engine_ = nullptr;
  std::optional<RequestId> id_;
  CancelCause cancel_requested_ = CancelCause::kNone;
};

}  // namespace switchserve

#endif  // SWITCHSERVE_SERVER_ENGINE_REQUEST_HANDLE_H_
