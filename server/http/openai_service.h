// The OpenAI-compatible HTTP API on top of the engine (docs/serving.md):
// POST /v1/completions (unary or server-sent events), GET /v1/models and
// /v1/models/{id}, POST /tokenize and /detokenize (vLLM's), GET /metrics (the
// metrics port's series, as vLLM serves them on its API port), GET /health
// (the process serves) and /ready (the model is loaded and the server is not
// draining). /v1/chat/completions is refused:
// the models have no chat template.
//
// Like the gRPC service, a handler authenticates (the same bearer token),
// checks the drain state, validates (the same ValidateGenerateRequest),
// hands the prompts to the engine and returns; the engine's updates complete
// the response, which is rendered off the engine thread (a streamed event on
// the connection's I/O thread, a unary response on one of the service's
// render threads, as is GET /metrics). A client that disconnects cancels its
// engine requests. Requests are counted in the same metrics (protocol="http")
// and end with one access-log line.
//
// Thread-safe; Handle runs on the HTTP server's I/O threads.
#ifndef SWITCHSERVE_SERVER_HTTP_OPENAI_SERVICE_H_
#define SWITCHSERVE_SERVER_HTTP_OPENAI_SERVICE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "engine/runtime/generation_engine.h"
#include "engine/text/tokenizer.h"
#include "server/access_log.h"
#include "server/auth.h"
#include "server/call_gate.h"
#include "server/http/http_server.h"
#include "server/http/render_threads.h"
#include "server/metrics/serving_metrics.h"
#include "server/request_validation.h"

namespace switchserve {

struct OpenAiServiceOptions {
  GenerationEngine* engine = nullptr;  // everything here must outlive the service
  const Tokenizer* tokenizer = nullptr;
  RequestLimits limits;
  std::string model_name;                 // the served model name (`model`)
  const BearerTokenAuth* auth = nullptr;  // null: no token needed
  ServingMetrics* metrics = nullptr;      // null: no metrics
  // GET /metrics: the Prometheus text of every series (MetricsExposer::Render).
  // Null: metrics are off, /metrics is 404.
  std::function<std::string()> metrics_text;
  CallGate* gate = nullptr;    // shared with the gRPC service
  int64_t created_unix_s = 0;  // the model's `created` (server start)
  int stream_interval = 1;     // streamed completions: tokens per event after the first
  // Prompts one request may hold (--max-queue: more could never be queued
  // together, and a retry would not help); 0: no limit.
  int max_prompts = 0;
  // Threads that render unary completion responses and GET /metrics
  // (RenderThreads).
  int render_threads = 2;
  // Output waiting for clients, all responses together (--output-buffer-bytes):
  // a unary completion's body that does not fit is answered 429. Null: no
  // limit.
  std::shared_ptr<ByteBudget> output_budget;
};

class OpenAiService {
 public:
  explicit OpenAiService(const OpenAiServiceOptions& options)
      : options_(options),
        render_threads_(std::make_unique<RenderThreads>(options.render_threads)) {}

  // Waits until every response being rendered has been handed to its
  // exchange, and stops the render threads. Called after the engine stopped
  // and before the HTTP server stops (whose exchanges must not be used after
  // that). Idempotent.
  void Stop() { render_threads_->Stop(); }

  void Handle(const std::shared_ptr<HttpExchange>& exchange) const;
  // HttpServerOptions::check_head: an API request (/v1/, /tokenize,
  // /detokenize, /metrics) without the bearer token
  // is refused at its head, its body never read (a completion counted and
  // logged as Handle would).
  std::optional<HttpResponse> CheckHead(const HttpRequest& head) const;
  // HttpServerOptions::on_own_error: an error the HTTP server answered
  // itself (a body over --max-request-bytes, a Transfer-Encoding it does not
  // decode, a malformed body) to a completion request is counted and logged,
  // and carries its request id, as Handle's refusals do.
  void OnOwnError(const HttpRequest& head, HttpResponse* response) const;

 private:
  // OK, or UNAUTHENTICATED naming what is wrong with the header.
  absl::Status Authorize(const HttpRequest& request) const;
  AccessRecord CompletionAccess(const HttpRequest& request) const;
  // The refusal of a completion, counted and logged.
  HttpResponse RefuseCompletion(const absl::Status& status, AccessRecord* access) const;
  // POST /v1/completions, its token checked.
  void Completions(const std::shared_ptr<HttpExchange>& exchange) const;
  // POST /tokenize and /detokenize (vLLM's), their token checked.
  HttpResponse Tokenize(const HttpRequest& request) const;
  HttpResponse Detokenize(const HttpRequest& request) const;
  // NOT_FOUND naming `model` unless it is empty or the served model's name.
  absl::Status CheckModel(const std::string& model) const;

  OpenAiServiceOptions options_;
  std::unique_ptr<RenderThreads> render_threads_;
};

// The body the HTTP server writes for its own errors (400, 413), in the
// API's error shape.
std::string OpenAiErrorBody(int http_status, const std::string& message);

}  // namespace switchserve

#endif  // SWITCHSERVE_SERVER_HTTP_OPENAI_SERVICE_H_
