// Request ids and the access log: what an operator needs to trace one
// request through the logs of a fleet.
//
// Every Generate / GenerateStream call and every HTTP completion request has
// an id: the client's `x-request-id` (gRPC metadata or HTTP header) when it
// sends a usable one, else a fresh random one. The server returns it (response
// metadata / header `x-request-id`) and writes it in every log line about the
// request, among them exactly one access-log line when the request ends,
// however it ends (served, rejected, cancelled, failed).
#ifndef SWITCHSERVE_SERVER_ACCESS_LOG_H_
#define SWITCHSERVE_SERVER_ACCESS_LOG_H_

#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "engine/runtime/request.h"

namespace switchserve {

inline constexpr std::string_view kRequestIdHeader = "x-request-id";
inline constexpr int kMaxRequestIdLength = 128;

// The client's id when it is 1 to 128 printable ASCII characters (no spaces),
// else a new random one (32 hex digits).
std::string AcceptOrMakeRequestId(std::optional<std::string_view> from_client);

// "length", "stop", "eos", "cancelled"; "" for kNone.
std::string_view FinishReasonName(FinishReason reason);

// One finished request, as the access log reports it.
struct AccessRecord {
  std::string request_id;
  std::string protocol;  // "grpc" or "http"
  std::string method;    // "Generate", "GenerateStream", "POST /v1/completions"
  std::string peer;      // the client's address (ip:port)
  absl::StatusCode status = absl::StatusCode::kOk;  // canonical code, both protocols
  int http_status = 0;                              // HTTP only
  // From the engine's final update; zero for requests it never saw.
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int cached_prompt_tokens = 0;  // logged when > 0 (prefix caching)
  double queue_ms = 0;
  double time_to_first_token_ms = 0;
  double total_ms = 0;
  FinishReason finish_reason = FinishReason::kNone;
  int32_t priority = 0;  // the request's; logged when not 0 (--scheduling-policy priority)
};

// Fills the token counts, timings and finish reason from a final update.
void FillFromFinalUpdate(const GenerationUpdate& final_update, AccessRecord* record);

// Writes the record's line (message "request", the fields above).
void LogAccess(const AccessRecord& record);

}  // namespace switchserve

#endif  // SWITCHSERVE_SERVER_ACCESS_LOG_H_
