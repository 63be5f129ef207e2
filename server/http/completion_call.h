// One /v1/completions request in flight: its prompts' engine requests (one
// choice each) and the response they build, unary JSON or server-sent
// events. The engine's updates arrive on the engine thread, a disconnect on
// an HTTP thread; the call answers through its HttpExchange and ends with one
// access-log line. Nothing is rendered on the engine thread: a streamed
// update's event (JSON, logprobs) is rendered on the connection's I/O thread,
// a unary response on one of the RenderThreads, which then answers the
// exchange, writes the access-log line and ends the call in the gate.
#ifndef SWITCHSERVE_SERVER_HTTP_COMPLETION_CALL_H_
#define SWITCHSERVE_SERVER_HTTP_COMPLETION_CALL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/runtime/generation_engine.h"
#include "engine/text/tokenizer.h"
#include "server/access_log.h"
#include "server/call_gate.h"
#include "server/http/http_server.h"
#include "server/http/render_threads.h"
#include "server/metrics/serving_metrics.h"

namespace switchserve {

struct CompletionCallContext {
  GenerationEngine* engine = nullptr;
  const Tokenizer* tokenizer = nullptr;
  ServingMetrics* metrics = nullptr;  // may be null
  CallGate* gate = nullptr;
  RenderThreads* render_threads = nullptr;  // renders unary responses
  std::string model_name;
  // What responses hold while they wait for their clients: a unary
  // response's body takes its bytes until written (HttpServerOptions'
  // output_budget counts the streams' events); null: no limit.
  std::shared_ptr<ByteBudget> output_budget;
};

struct CompletionOptions {
  bool stream = false;
  bool include_usage = false;
  // With include_usage: every event carries its choice's usage so far
  // (vLLM's continuous_usage_stats).
  bool continuous_usage = false;
  int logprobs = -1;              // < 0: no logprobs object
  bool tokens_as_ids = false;     // CompletionRequest::tokens_as_ids
  bool return_token_ids = false;  // CompletionRequest::return_token_ids
  bool echo = false;              // CompletionRequest::echo
  bool echo_only = false;         // CompletionRequest::echo_only
  int n = 1;                      // choices per prompt, consecutive in `prompts`
  // Each choice's `prompt_logprobs` with this many alternatives (unary);
  // < 0: none.
  int prompt_logprobs = -1;
};

// Submits `prompts` (validated; origin and arrival set; a prompt's n choices
// one after another, the response's choices in that order) and answers the
// exchange when they finish. Counts itself in the gate until then (until the
// response was handed to the exchange). When the
// engine refuses a prompt (full queue, stopping) the others are cancelled
// and the client gets the engine's error (429, 503).
void StartCompletionCall(const CompletionCallContext& context,
                         std::shared_ptr<HttpExchange> exchange, CompletionOptions options,
                         std::vector<GenerationRequest> prompts, AccessRecord access);

}  // namespace switchserve

#endif  // SWITCHSERVE_SERVER_HTTP_COMPLETION_CALL_H_
