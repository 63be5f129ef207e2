#include "server/metrics/engine_metrics_observer.h"

#include <optional>
#include <string>

#include "server/log.h"

namespace switchserve {

EngineMetricsObserver::EngineMetricsObserver(ServingMetrics* serving, MoeMetrics* moe,
                                             int64_t total_kv_blocks)
    : serving_(serving), moe_(moe), total_kv_blocks_(total_kv_blocks) {}

void EngineMetricsObserver::OnStep(const StepReport& report) {
  // MoE first: a scrape that sees this step's serving figures then also sees
  // its routing (the exposer collects the serving registry before MoE).
  if (moe_ != nullptr && report.routing != nullptr) {
    if (absl::Status status = moe_->RecordStep(*report.routing);
        !status.ok() && !moe_error_logged_) {
      // A backend/model mismatch; say so once rather than on every step.
      Log(LogLevel::kWarning,
          "MoE metrics leave out a step whose routing statistics do not fit the model (said once)",
          {{"error", status.ToString()}});
      moe_error_logged_ = true;
    }
  }
  serving_->RecordStep(
      {.duration_seconds = (report.schedule_ms + report.forward_ms + report.update_ms) / 1e3,
       .prefill_tokens = report.prefill_tokens,
       .decode_tokens = report.decode_tokens,
       .preemptions = report.preempted,
       .priority_preemptions = report.priority_preempted,
       .prefix_query_tokens = report.prefix_query_tokens,
       .prefix_hit_tokens = report.prefix_hit_tokens});
}

void EngineMetricsObserver::OnStateChanged(const EngineSnapshot& snapshot) {
  serving_->SetEngineState(snapshot.running, snapshot.waiting, UsageRatio(snapshot.used_blocks));
}

double EngineMetricsObserver::UsageRatio(int64_t used_blocks) const {
  return total_kv_blocks_ > 0
             ? static_cast<double>(used_blocks) / static_cast<double>(total_kv_blocks_)
             : 0.0;
}

void EngineMetricsObserver::OnRequestFinished(const GenerationRequest& request,
                                              const GenerationUpdate& final_update) {
  // Requests from clients only: the server's own warm-up has no protocol.
  if (!ParseRequestProtocol(request.origin.protocol)) return;
  // The call or HTTP request itself is counted by its front end
  // (server/generate_calls.cc, server/http/completion_call.cc), with the
  // status its client sees.
  FinishedRequestSample sample;
  FinishedBy finished_by = FinishedBy::kError;
  if (!final_update.status.ok()) {
    sample.status = final_update.status.code();
  } else if (final_update.finish_reason == FinishReason::kCancelled) {
    sample.status = absl::StatusCode::kCancelled;  // not timed, whatever the cause
    finished_by = FinishedBy::kCancelled;
  } else {
    sample.status = absl::StatusCode::kOk;
    finished_by = final_update.finish_reason == FinishReason::kLength ? FinishedBy::kLength
                  : final_update.finish_reason == FinishReason::kEos  ? FinishedBy::kEos
                                                                      : FinishedBy::kStop;
  }
  sample.e2e_seconds = final_update.total_ms / 1e3;
  sample.generated_tokens = final_update.completion_tokens;
  sample.decode_seconds = (final_update.total_ms - final_update.time_to_first_token_ms) / 1e3;
  // Those with a first token were recorded when it came (OnFirstToken).
  if (final_update.completion_tokens == 0) {
    serving_->RecordQueueTime(final_update.queue_ms / 1e3);
    serving_->RecordEndedWithoutFirstToken(final_update.total_ms / 1e3);
  }
  serving_->RecordFinished(sample);
  serving_->RecordEngineFinished(finished_by, final_update.prompt_tokens,
                                 final_update.completion_tokens);
}

void EngineMetricsObserver::OnFirstToken(const GenerationRequest& request, double queue_seconds,
                                         double first_token_seconds) {
  if (!ParseRequestProtocol(request.origin.protocol)) return;  // the server's warm-up
  serving_->RecordQueueTime(queue_seconds);
  serving_->RecordFirstToken(first_token_seconds);
}

}  // namespace switchserve
