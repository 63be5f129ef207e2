#include "bench/load/engine_transport.h"

#include <memory>
#include <string>
#include <utility>

namespace switchserve::bench {
namespace {

// Called on the engine thread; only counts and, at the end, hands over to
// the load generator (which may submit the next request: Submit is safe to
// call from a sink, the engine holds no lock while it delivers updates).
class ProgressSink : public GenerationSink {
 public:
  explicit ProgressSink(RequestProgress* progress) : progress_(progress) {}
  void OnUpdate(GenerationUpdate update) override {
    progress_->OnTokens(static_cast<int>(update.tokens.size()));
    if (update.finished) progress_->OnDone(update.status.ok(), update.status.ToString());
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
  request.arrival = Clock::now();
  request.deadline = request.arrival + timeout_;
  request.sink = std::make_shared<ProgressSink>(progress);
  if (absl::StatusOr<RequestId> id = engine_->Submit(std::move(request)); !id.ok()) {
    progress->OnDone(false, id.status().ToString());
  }
}

}  // namespace switchserve::bench
