#include "server/http/openai_service.h"

#include <chrono>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/text/detokenizer.h"
#include "nlohmann/json.hpp"
#include "server/access_log.h"
#include "server/http/completion_call.h"
#include "server/http/openai_protocol.h"
#include "server/version.h"

namespace switchserve {
namespace {

using Json = nlohmann::json;

HttpResponse JsonResponse(int status, const Json& body) {
  HttpResponse response;
  response.status = status;
  response.body = body.dump(-1, ' ', false, Json::error_handler_t::replace);
  return response;
}

HttpResponse ErrorResponse(const absl::Status& status) {
  const ApiError error = MakeApiError(status);
  return JsonResponse(error.http_status, error.body);
}

// Paths whose requests need the bearer token: the API's, not the probes.
bool Guarded(std::string_view path) {
  return path.rfind("/v1/", 0) == 0 || path == "/tokenize" || path == "/detokenize" ||
         path == "/metrics";
}

absl::Status Draining() {
  return absl::UnavailableError("the server is shutting down; retry on another replica");
}

// The code of an answer the HTTP layer gives itself (body or head too large:
// RESOURCE_EXHAUSTED; malformed, an encoding or expectation it does not
// support: INVALID_ARGUMENT).
absl::StatusCode OwnErrorCode(int http_status) {
  return http_status == 413 || http_status == 429 || http_status == 431
             ? absl::StatusCode::kResourceExhausted
             : absl::StatusCode::kInvalidArgument;
}

}  // namespace

std::string OpenAiErrorBody(int http_status, const std::string& message) {
  ApiError error = MakeApiError(absl::Status(OwnErrorCode(http_status), message));
  // 429 (the request bodies held are at their limit) is a full server's
  // `rate_limit_error`, as a full queue's; the rest are the request's fault.
  if (http_status != 429) error.body["error"]["type"] = "invalid_request_error";
  return error.body.dump(-1, ' ', false, Json::error_handler_t::replace);
}

void OpenAiService::Handle(const std::shared_ptr<HttpExchange>& exchange) const {
  const HttpRequest& request = exchange->request();
  const std::string path(request.Path());
  const bool get = request.method == "GET" || request.method == "HEAD";
  auto wrong_method = [&](const char* allowed) {
    HttpResponse response = ErrorResponse(absl::InvalidArgumentError(
        absl::StrCat(request.method, " ", path, ": method not allowed (", allowed, ")")));
    response.status = 405;
    response.headers.emplace_back("allow", allowed);
    exchange->Respond(std::move(response));
  };

  if (path == "/health") {
    if (!get) return wrong_method("GET");
    return exchange->Respond(JsonResponse(200, {{"status", "ok"}}));
  }
  if (path == "/ready") {
    if (!get) return wrong_method("GET");
    const bool draining = options_.gate->draining();
    return exchange->Respond(
        JsonResponse(draining ? 503 : 200, {{"status", draining ? "draining" : "ready"}}));
  }
  if (path == "/version") {
    if (!get) return wrong_method("GET");
    return exchange->Respond(JsonResponse(200, {{"version", Version()}, {"revision", Revision()}}));
  }
  if (!Guarded(path)) {
    return exchange->Respond(
        ErrorResponse(absl::NotFoundError(absl::StrCat(path, ": no such endpoint"))));
  }
  // The token, as the HTTP server checks it at the head (where the server
  // has check_head, a request without it does not get here).
  if (std::optional<HttpResponse> refusal = CheckHead(request)) {
    return exchange->Respond(*std::move(refusal));
  }
  if (path == "/metrics") {
    if (!get) return wrong_method("GET");
    if (!options_.metrics_text) {
      return exchange->Respond(ErrorResponse(absl::NotFoundError(
          "/metrics: metrics are off (the server runs with --metrics-port 0)")));
    }
    // Every series rendered takes milliseconds (a hundred and more for the
    // paper's routing shape): on a render thread, so that the streams this
    // I/O thread writes do not wait for a scrape.
    render_threads_->Post([exchange, render = options_.metrics_text] {
      HttpResponse response;
      response.status = 200;
      response.content_type = "text/plain; version=0.0.4; charset=utf-8";
      response.body = render();
      exchange->Respond(std::move(response));
    });
    return;
  }
  if (path == "/tokenize" || path == "/detokenize") {
    if (request.method != "POST") return wrong_method("POST");
    return exchange->Respond(path == "/tokenize" ? Tokenize(request) : Detokenize(request));
  }
  if (path == "/v1/completions") {
    if (request.method != "POST") return wrong_method("POST");
    return Completions(exchange);
  }
  const Json model = {{"id", options_.model_name},
                      {"object", "model"},
                      {"created", options_.created_unix_s},
                      {"owned_by", "switchserve"},
                      {"max_model_len", options_.limits.context_length}};
  if (path == "/v1/models") {
    if (!get) return wrong_method("GET");
    return exchange->Respond(
        JsonResponse(200, {{"object", "list"}, {"data", Json::array({model})}}));
  }
  if (path.rfind("/v1/models/", 0) == 0) {
    if (!get) return wrong_method("GET");
    if (path.substr(11) == options_.model_name) return exchange->Respond(JsonResponse(200, model));
    return exchange->Respond(ErrorResponse(absl::NotFoundError(
        absl::StrCat("the model `", ShownName(path.substr(11)),
                     "` does not exist; this server serves `", options_.model_name, "`"))));
  }
  if (path == "/v1/chat/completions") {
    return exchange->Respond(ErrorResponse(absl::NotFoundError(
        "/v1/chat/completions is not served: the model has no chat template (it is a plain "
        "language model); send the text to /v1/completions")));
  }
  exchange->Respond(ErrorResponse(absl::NotFoundError(absl::StrCat(path, ": no such endpoint"))));
}

absl::Status OpenAiService::Authorize(const HttpRequest& request) const {
  if (options_.auth == nullptr) return absl::OkStatus();
  const absl::Status status = options_.auth->CheckAuthorization(request.Header("authorization"));
  if (status.ok()) return status;
  // The gRPC message speaks of metadata; HTTP clients send a header.
  return absl::UnauthenticatedError(status.message() == "invalid bearer token"
                                        ? "invalid bearer token"
                                        : "missing `Authorization: Bearer <token>` header");
}

std::optional<HttpResponse> OpenAiService::CheckHead(const HttpRequest& head) const {
  const std::string path(head.Path());
  if (!Guarded(path)) return std::nullopt;
  const absl::Status authorized = Authorize(head);
  if (authorized.ok()) return std::nullopt;
  if (path == "/v1/completions" && head.method == "POST") {
    AccessRecord access = CompletionAccess(head);
    return RefuseCompletion(authorized, &access);
  }
  return ErrorResponse(authorized);
}

void OpenAiService::OnOwnError(const HttpRequest& head, HttpResponse* response) const {
  if (head.Path() != "/v1/completions" || head.method != "POST") return;
  AccessRecord access = CompletionAccess(head);
  access.status = OwnErrorCode(response->status);
  access.http_status = response->status;
  response->headers.emplace_back("x-request-id", access.request_id);
  if (options_.metrics != nullptr) {
    options_.metrics->RecordRequest(RequestProtocol::kHttp, access.status);
  }
  LogAccess(access);
}

AccessRecord OpenAiService::CompletionAccess(const HttpRequest& request) const {
  AccessRecord access;
  access.request_id = AcceptOrMakeRequestId(request.Header(kRequestIdHeader));
  access.protocol = "http";
  access.method = "POST /v1/completions";
  access.peer = request.peer;
  return access;
}

HttpResponse OpenAiService::RefuseCompletion(const absl::Status& status,
                                             AccessRecord* access) const {
  HttpResponse response = ErrorResponse(status);
  response.headers.emplace_back("x-request-id", access->request_id);
  access->status = status.code();
  access->http_status = response.status;
  if (options_.metrics != nullptr) {
    options_.metrics->RecordRequest(RequestProtocol::kHttp, status.code());
  }
  LogAccess(*access);
  return response;
}

absl::Status OpenAiService::CheckModel(const std::string& model) const {
  if (model.empty() || model == options_.model_name) return absl::OkStatus();
  return absl::NotFoundError(absl::StrCat("model: `", ShownName(model),
                                          "` does not exist; this server serves `",
                                          options_.model_name, "`"));
}

HttpResponse OpenAiService::Tokenize(const HttpRequest& request) const {
  if (options_.gate->draining()) return ErrorResponse(Draining());
  auto parsed = ParseTokenizeRequest(request.body);
  if (!parsed.ok()) return ErrorResponse(parsed.status());
  if (absl::Status served = CheckModel(parsed->model); !served.ok()) return ErrorResponse(served);
  auto ids = options_.tokenizer->Encode(parsed->prompt);
  if (!ids.ok()) {
    return ErrorResponse(
        absl::InvalidArgumentError(absl::StrCat("prompt: ", ids.status().message())));
  }
  Json body = {
      {"count", ids->size()}, {"max_model_len", options_.limits.context_length}, {"tokens", *ids}};
  if (parsed->return_token_strs) {
    Json strs = Json::array();
    for (const int32_t id : *ids) strs.push_back(TokenString(*options_.tokenizer, id));
    body["token_strs"] = std::move(strs);
  }
  return JsonResponse(200, body);
}

HttpResponse OpenAiService::Detokenize(const HttpRequest& request) const {
  if (options_.gate->draining()) return ErrorResponse(Draining());
  auto parsed = ParseDetokenizeRequest(request.body, options_.limits.vocab_size);
  if (!parsed.ok()) return ErrorResponse(parsed.status());
  if (absl::Status served = CheckModel(parsed->model); !served.ok()) return ErrorResponse(served);
  return JsonResponse(200, {{"prompt", DecodedText(*options_.tokenizer, parsed->tokens)}});
}

void OpenAiService::Completions(const std::shared_ptr<HttpExchange>& exchange) const {
  const HttpRequest& request = exchange->request();
  AccessRecord access = CompletionAccess(request);
  auto reject = [&](const absl::Status& status) {
    exchange->Respond(RefuseCompletion(status, &access));
  };

  if (options_.gate->draining()) return reject(Draining());
  auto parsed = ParseCompletionRequest(request.body, options_.limits.vocab_size);
  if (!parsed.ok()) return reject(parsed.status());
  access.priority = parsed->priority;
  if (absl::Status served = CheckModel(parsed->model); !served.ok()) return reject(served);
  const int count = static_cast<int>(parsed->prompts.size());
  const int n = parsed->n;
  // Every choice is a request in the engine's queue.
  if (options_.max_prompts > 0 && int64_t{count} * n > options_.max_prompts) {
    if (n == 1) {
      return reject(absl::InvalidArgumentError(
          absl::StrCat("prompt: at most ", options_.max_prompts,
                       " prompts in one request (--max-queue), found ", count)));
    }
    return reject(absl::InvalidArgumentError(absl::StrCat(
        "n: at most ", options_.max_prompts, " choices in one request (--max-queue), found ",
        int64_t{count} * n, " (", count, " prompts, n = ", n, ")")));
  }
  std::vector<GenerationRequest> prompts;
  prompts.reserve(static_cast<size_t>(count) * n);
  const auto arrival = Clock::now();
  for (int i = 0; i < count; ++i) {
    auto prepared =
        ValidateGenerateRequest(parsed->prompts[i], *options_.tokenizer, options_.limits);
    if (!prepared.ok()) return reject(ToApiError(prepared.status(), i, count));
    prepared->arrival = arrival;
    prepared->origin = {.request_id = access.request_id, .protocol = "http"};
    // "logprobs": 0 still reports each token's own logprob.
    prepared->sampling.sampled_logprob = parsed->logprobs.has_value();
    prepared->stream_interval = parsed->stream ? options_.stream_interval : 0;
    // The prompt's choices draw from generators seeded seed, seed + 1, ...
    // (the seed sent, or the one the validation drew), as vLLM seeds them:
    // a seeded request gives the same choices again.
    for (int j = 0; j < n; ++j) {
      prompts.push_back(j + 1 < n ? *prepared : std::move(*prepared));
      prompts.back().sampling.seed += static_cast<uint64_t>(j);
    }
  }
  CompletionOptions options;
  options.stream = parsed->stream;
  options.include_usage = parsed->include_usage;
  options.continuous_usage = parsed->include_usage && parsed->continuous_usage;
  options.logprobs = parsed->logprobs.value_or(-1);
  options.tokens_as_ids = parsed->tokens_as_ids;
  options.return_token_ids = parsed->return_token_ids;
  options.echo = parsed->echo;
  options.prompt_logprobs = parsed->prompt_logprobs.value_or(-1);
  options.echo_only = parsed->echo_only;
  options.n = n;
  StartCompletionCall({.engine = options_.engine,
                       .tokenizer = options_.tokenizer,
                       .metrics = options_.metrics,
                       .gate = options_.gate,
                       .render_threads = render_threads_.get(),
                       .model_name = options_.model_name,
                       .output_budget = options_.output_budget},
                      exchange, options, std::move(prompts), std::move(access));
}

}  // namespace switchserve
