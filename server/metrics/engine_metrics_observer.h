// Connects the engine to the metrics: an EngineObserver that turns each
// engine step's report (batch shape, timings, the step's routing
// statistics), the engine's state whenever it changes (queue depths, KV
// blocks) and each finished request into ServingMetrics and MoeMetrics
// updates.
//
// Runs on the engine thread, once per step and once per finished request; it
// never takes a lock per token (MoeMetrics takes one short lock per step).
#ifndef SWITCHSERVE_SERVER_METRICS_ENGINE_METRICS_OBSERVER_H_
#define SWITCHSERVE_SERVER_METRICS_ENGINE_METRICS_OBSERVER_H_

#include <cstdint>

#include "engine/runtime/generation_engine.h"
#include "server/metrics/moe_metrics.h"
#include "server/metrics/serving_metrics.h"

namespace switchserve {

class EngineMetricsObserver : public EngineObserver {
 public:
  // `serving` must outlive the observer; `moe` too, or be null (MoE metrics
  // off). `total_kv_blocks` is the engine's KV cache size, for the usage
  // ratio.
  EngineMetricsObserver(ServingMetrics* serving, MoeMetrics* moe, int64_t total_kv_blocks);

  void OnStep(const StepReport& report) override;
  // The running and waiting gauges and the KV cache's usage, also between
  // steps: a request cancelled while the engine idles leaves them at zero.
  void OnStateChanged(const EngineSnapshot& snapshot) override;
  // Counts the request by protocol (its origin's) and by the status its
  // client sees: OK (finished by length, stop or EOS), CANCELLED (cancelled
  // by the client), DEADLINE_EXCEEDED (past its deadline), UNAVAILABLE
  // (ended by the server's shutdown) or the engine error's code; and by
  // finish reason, prompt and generation length. Requests rejected before
  // reaching the engine are counted by the gRPC and HTTP services
  // (ServingMetrics::RecordFinished). Requests without a protocol are not
  // counted (the server's warm-up is not even observed).
  void OnRequestFinished(const GenerationRequest& request,
                         const GenerationUpdate& final_update) override;
  // The time to first token and the queue time, as the token comes: a
  // request's first-token latency reaches the SLO's windows then, not when
  // its generation ends (minutes later for a long one).
  void OnFirstToken(const GenerationRequest& request, double queue_seconds,
                    double first_token_seconds) override;

 private:
  // Used KV blocks over all of them (0 without a cache).
  double UsageRatio(int64_t used_blocks) const;

  ServingMetrics* const serving_;
  MoeMetrics* const moe_;
  const int64_t total_kv_blocks_;
  bool moe_error_logged_ = false;
};

}  // namespace switchserve

#endif  // SWITCHSERVE_SERVER_METRICS_ENGINE_METRICS_OBSERVER_H_
