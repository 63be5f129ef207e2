#include "bench/load/engine_transport.h"

#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "server/generate_calls.h"

namespace switchserve::bench {
namespace {

// A failure as GrpcTransport reports it (the status code's number, then its
// message), so that the two transports' error breakdowns agree.
std::string GrpcStyleError(int code, absl::string_view message) {
  return absl::StrCat(code, " ", message);
}

// The error a gRPC client gets for a request the engine ended with `update`
// (its final update), or "" when it succeeded. A request the engine cancelled
// is a failure, with the status the server ends the call with
// (server/generate_calls.h); at its deadline the gRPC client ends the call
// itself, with gRPC's own message.
std::string ErrorOf(const GenerationUpdate& update) {
  if (!update.status.ok()) {
    return GrpcStyleError(static_cast<int>(update.status.code()), update.status.message());
  }
  if (update.finish_reason != FinishReason::kCancelled) return "";
  const grpc::Status status = CancelledCallStatus(update.cancel_cause);
  return GrpcStyleError(status.error_code(),
                        status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED
                            ? "Deadline Exceeded"
                            : status.error_message());
}

// Called on the engine thread; only counts and, at the end, hands over to
// the load generator (which may submit the next request: Submit is safe to
// call from a sink, the engine holds no lock while it delivers updates).
class ProgressSink : public GenerationSink {
 public:
  explicit ProgressSink(RequestProgress* progress) : progress_(progress) {}
  void OnUpdate(GenerationUpdate update) override {
    progress_->OnTokens(static_cast<int>(update.tokens.size()));
    if (!update.finished) return;
    const std::string error = ErrorOf(update);
    progress_->OnDone(error.empty(), error);
  }

 private:
  RequestProgress* const progress_;
};

}  // namespace

EngineTransport::EngineTransport(GenerationEngine* engine, GenerationRequest request,
                                 double timeout_s)
    : engine_(engine),
      request_(std::move(request)),
      timeout_(static_cast<int64_t>(timeout_s * 1000)) {}

void EngineTransport::Start(uint64_t seed, RequestProgress* progress) {
  GenerationRequest request = request_;
  request.sampling.seed = seed;
  VaryTail(seed, request.prompt);
  request.arrival = Clock::now();
  request.deadline = request.arrival + timeout_;
  request.sink = std::make_shared<ProgressSink>(progress);
  if (absl::StatusOr<RequestId> id = engine_->Submit(std::move(request)); !id.ok()) {
    progress->OnDone(false,
                     GrpcStyleError(static_cast<int>(id.status().code()), id.status().message()));
  }
}

}  // namespace switchserve::bench
