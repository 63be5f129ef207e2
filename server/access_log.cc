#include "server/access_log.h"

#include <cmath>
#include <random>

#include "absl/strings/str_format.h"
#include "server/log.h"

namespace switchserve {
namespace {

bool UsableRequestId(std::string_view id) {
  if (id.empty() || id.size() > static_cast<size_t>(kMaxRequestIdLength)) return false;
  for (const char c : id) {
    if (c < 0x21 || c > 0x7e) return false;
  }
  return true;
}

// Milliseconds with 0.1 ms resolution: enough for a log, and short.
double Rounded(double ms) { return std::round(ms * 10.0) / 10.0; }

}  // namespace

std::string AcceptOrMakeRequestId(std::optional<std::string_view> from_client) {
  if (from_client && UsableRequestId(*from_client)) return std::string(*from_client);
  static thread_local std::mt19937_64 generator{std::random_device{}()};
  const uint64_t high = generator();
  const uint64_t low = generator();
  return absl::StrFormat("%016x%016x", high, low);
}

std::string_view FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kLength:
      return "length";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kEos:
      return "eos";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kNone:
      break;
  }
  return "";
}

void FillFromFinalUpdate(const GenerationUpdate& final_update, AccessRecord* record) {
  record->prompt_tokens = final_update.prompt_tokens;
  record->completion_tokens = final_update.completion_tokens;
  record->cached_prompt_tokens = final_update.cached_prompt_tokens;
  record->queue_ms = final_update.queue_ms;
  record->time_to_first_token_ms = final_update.time_to_first_token_ms;
  record->total_ms = final_update.total_ms;
  record->finish_reason = final_update.finish_reason;
}

void LogAccess(const AccessRecord& record) {
  LogFields fields = {
      {"request_id", record.request_id},
      {"protocol", record.protocol},
      {"method", record.method},
      {"peer", record.peer},
      {"status", absl::StatusCodeToString(record.status)},
  };
  if (record.http_status != 0) fields["http_status"] = record.http_status;
  fields["prompt_tokens"] = record.prompt_tokens;
  fields["completion_tokens"] = record.completion_tokens;
  if (record.cached_prompt_tokens > 0) fields["cached_prompt_tokens"] = record.cached_prompt_tokens;
  fields["queue_ms"] = Rounded(record.queue_ms);
  // Only for a request that produced a token: without one there is no first
  // token to time (the engine's figure is then its end).
  if (record.completion_tokens > 0) fields["ttft_ms"] = Rounded(record.time_to_first_token_ms);
  fields["total_ms"] = Rounded(record.total_ms);
  fields["finish_reason"] = FinishReasonName(record.finish_reason);
  if (record.priority != 0) fields["priority"] = record.priority;
  LogInfo("request", fields);
}

}  // namespace switchserve
