#include "server/http/completion_call.h"

#include <algorithm>
#include <ctime>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/text/detokenizer.h"
#include "nlohmann/json.hpp"
#include "server/engine_request_handle.h"
#include "server/http/openai_protocol.h"
#include "server/log.h"

namespace switchserve {
namespace {

using Json = nlohmann::ordered_json;

std::string Dump(const Json& json) {
  return json.dump(-1, ' ', false, Json::error_handler_t::replace);
}

std::string Event(const Json& json) { return absl::StrCat("data: ", Dump(json), "\n\n"); }

// vLLM's `stop_reason` of a choice the final update ends: the stop string or
// stop token id that ended it, else null (an EOS, a length, unfinished).
Json StopReason(const GenerationUpdate& final_update) {
  if (final_update.finish_reason != FinishReason::kStop) return nullptr;
  if (final_update.stop_token_id >= 0) return final_update.stop_token_id;
  return final_update.stop_string;
}

class CompletionCall : public std::enable_shared_from_this<CompletionCall> {
 public:
  CompletionCall(const CompletionCallContext& context, std::shared_ptr<HttpExchange> exchange,
                 CompletionOptions options, int num_prompts, AccessRecord access)
      : context_(context),
        exchange_(std::move(exchange)),
        options_(options),
        created_(static_cast<int64_t>(std::time(nullptr))),
        access_(std::move(access)) {
    for (int i = 0; i < num_prompts; ++i) choices_.push_back(std::make_unique<Choice>());
  }
  // A stream whose end was never logged, its connection gone before its
  // last events were written without the exchange being told (the server
  // stopping with the connection's queue unrun): its client did not get
  // them.
  ~CompletionCall() {
    if (stream_end_.has_value() && !stream_logged_) {
      LogStreamEnd(absl::StatusCode::kUnavailable, HttpStatusFor(absl::StatusCode::kUnavailable));
      context_.gate->CallDone();
    }
  }

  void Start(std::vector<GenerationRequest> prompts) {
    context_.gate->CallStarted();
    bool done = false;
    {
      // Held while submitting: updates of early prompts wait until every
      // prompt is in and the stream has started.
      std::lock_guard<std::mutex> lock(mu_);
      std::vector<EngineRequestHandle*> handles;
      for (size_t i = 0; i < prompts.size(); ++i) {
        prompts[i].sink = std::make_shared<Sink>(shared_from_this(), static_cast<int>(i));
        Choice& choice = *choices_[i];
        if (options_.echo) {
          // The text and its offsets start at the prompt's first token.
          choice.echo_text = DecodedText(*context_.tokenizer, prompts[i].prompt);
          choice.echo_first.token_id = prompts[i].prompt.front();
          choice.echo_pending = true;
        } else {
          choice.text_offset.text_started =
              PromptSpellsText(*context_.tokenizer, prompts[i].prompt);
        }
        if (options_.return_token_ids) choice.prompt_ids = prompts[i].prompt;
        choices_[i]->stop_token_ids = prompts[i].sampling.stop_token_ids;
        choices_[i]->prompt_tokens = static_cast<int>(prompts[i].prompt.size());
        choices_[i]->include_stop = prompts[i].sampling.include_stop_str_in_output;
        handles.push_back(&choices_[i]->handle);
      }
      // All the prompts are queued or none: a refused request takes no room
      // in the queue and leaves no request in the engine or its metrics.
      const int num_prompts = static_cast<int>(prompts.size());
      absl::Status status =
          EngineRequestHandle::SubmitAll(context_.engine, handles, std::move(prompts));
      if (status.ok()) {
        remaining_ = num_prompts;
      } else {
        rejected_ = true;
        RejectLocked(status);
        done = true;
      }
      if (!rejected_ && options_.stream) {
        HttpResponse head;
        head.content_type = "text/event-stream";
        head.headers = {{"cache-control", "no-cache"}, {"x-request-id", access_.request_id}};
        exchange_->StartStream(std::move(head));
      }
    }
    if (done) context_.gate->CallDone();
    if (rejected_) return;
    std::weak_ptr<CompletionCall> weak = weak_from_this();
    exchange_->OnClientGone([weak](const absl::Status& why) {
      if (auto call = weak.lock()) call->ClientGone(why);
    });
  }

 private:
  struct Choice {
    EngineRequestHandle handle;
    std::string text;                        // unary: everything so far
    std::vector<GeneratedTokenInfo> tokens;  // unary with logprobs
    // Unary with prompt_logprobs: the prompt's tokens after the first, scored.
    std::vector<GeneratedTokenInfo> prompt_logprobs;
    // With return_token_ids: the prompt's ids (a stream: until its first
    // event takes them), and the generated ids so far (unary).
    std::vector<int32_t> prompt_ids;
    std::vector<int32_t> token_ids;
    TextOffset text_offset;               // of the next token, for logprobs
    std::vector<int32_t> stop_token_ids;  // the request's (TextEndOf)
    bool include_stop = false;            // its include_stop_str_in_output
    int prompt_tokens = 0;                // its prompt's (continuous usage)
    int streamed_tokens = 0;              // generated tokens streamed so far
    std::optional<GenerationUpdate> final_update;
    // With echo: the prompt's text, its first token (whose logprob is null),
    // and whether they are still to be added before the first tokens.
    std::string echo_text;
    GeneratedTokenInfo echo_first;
    bool echo_pending = false;
  };

  class Sink : public GenerationSink {
   public:
    Sink(std::shared_ptr<CompletionCall> call, int index) : call_(std::move(call)), index_(index) {}
    void OnUpdate(GenerationUpdate update) override { call_->OnUpdate(index_, std::move(update)); }

   private:
    std::shared_ptr<CompletionCall> call_;
    int index_;
  };

  // Engine thread.
  void OnUpdate(int index, GenerationUpdate update) {
    if (options_.echo_only) {
      // The prompt alone: the token the engine generated is left out, and the
      // choice ends where the prompt does ("length", as vLLM answers).
      update.text.clear();
      update.tokens.clear();
      if (update.finished && update.finish_reason != FinishReason::kCancelled) {
        update.finish_reason = FinishReason::kLength;
      }
    }
    bool done = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      Choice& choice = *choices_[index];
      if (!rejected_ && !gone_) {
        if (options_.stream) {
          StreamUpdateLocked(index, &update);
        } else {
          if (options_.prompt_logprobs >= 0) {
            // Copied: an echo's logprobs take them too.
            choice.prompt_logprobs.insert(choice.prompt_logprobs.end(),
                                          update.prompt_logprobs.begin(),
                                          update.prompt_logprobs.end());
          }
          if (options_.return_token_ids) AppendIds(update.tokens, &choice.token_ids);
          TakeEchoLocked(&choice, &update);
          choice.text += update.text;
          if (options_.logprobs >= 0) {
            std::move(update.tokens.begin(), update.tokens.end(),
                      std::back_inserter(choice.tokens));
          }
        }
      }
      if (update.finished) {
        update.tokens.clear();
        choice.final_update = std::move(update);
        done = --remaining_ == 0;
        // A unary response is rendered, and the call ended, on a render thread.
        if (done && !rejected_) done = FinishLocked();
      }
    }
    if (done) context_.gate->CallDone();
  }

  // An HTTP thread: the response cannot be completed (HttpExchange::
  // OnClientGone): the client disconnected (CANCELLED), or the server closed
  // a stream whose client left too much output unread (RESOURCE_EXHAUSTED,
  // logged, as that client sees no status). A stream whose prompts had all
  // finished is logged and counted here, its last events unwritten: its
  // client did not get the whole response.
  void ClientGone(const absl::Status& why) {
    bool done = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      gone_ = true;
      gone_code_ = why.code();
      for (auto& choice : choices_) choice->handle.Cancel();
      if (why.code() != absl::StatusCode::kCancelled) {
        Log(LogLevel::kWarning, "stream ended",
            {{"request_id", access_.request_id}, {"peer", access_.peer}, {"why", why.ToString()}});
      }
      if (stream_end_.has_value() && !stream_logged_) {
        LogStreamEnd(why.code(), HttpStatusFor(why.code()));
        done = true;
      }
    }
    if (done) context_.gate->CallDone();
  }

  // A response's or event's fields before its choices.
  Json Head() const {
    return {{"id", absl::StrCat("cmpl-", access_.request_id)},
            {"object", "text_completion"},
            {"created", created_},
            {"model", context_.model_name}};
  }

  Json Chunk(Json choices) const {
    Json chunk = Head();
    chunk["choices"] = std::move(choices);
    if (options_.include_usage) chunk["usage"] = nullptr;
    return chunk;
  }

  // Engine thread: with echo, puts the prompt's text and tokens (its first,
  // then those the update scores) before the update's first ones. True when
  // it did (the first token is the prompt's).
  bool TakeEchoLocked(Choice* choice, GenerationUpdate* update) {
    if (!choice->echo_pending) return false;
    choice->echo_pending = false;
    update->text.insert(0, std::exchange(choice->echo_text, {}));
    std::vector<GeneratedTokenInfo> tokens;
    if (options_.logprobs >= 0) {
      tokens.reserve(1 + update->prompt_logprobs.size() + update->tokens.size());
      tokens.push_back(choice->echo_first);
      std::move(update->prompt_logprobs.begin(), update->prompt_logprobs.end(),
                std::back_inserter(tokens));
      std::move(update->tokens.begin(), update->tokens.end(), std::back_inserter(tokens));
      update->tokens = std::move(tokens);
    }
    return true;
  }

  // Engine thread: hands the update's text and tokens (moved out of it) to
  // the connection's I/O thread, which renders the event (RenderEvent).
  void StreamUpdateLocked(int index, GenerationUpdate* update) {
    if (!update->status.ok() || update->finish_reason == FinishReason::kCancelled) return;
    Choice& choice = *choices_[index];
    choice.streamed_tokens += static_cast<int>(update->tokens.size());  // before the echo's
    const int streamed = choice.streamed_tokens;
    TokenIds ids;
    if (options_.return_token_ids) AppendIds(update->tokens, &ids.generated);
    const bool echoed = TakeEchoLocked(&choice, update);
    if (update->text.empty() && update->tokens.empty() && !update->finished) return;
    if (options_.return_token_ids) ids.prompt = std::exchange(choice.prompt_ids, {});
    exchange_->WriteRendered(
        [self = shared_from_this(), index, text = std::move(update->text),
         tokens = std::move(update->tokens),
         finish_reason =
             update->finished ? std::optional<FinishReason>(update->finish_reason) : std::nullopt,
         stop_reason = update->finished ? StopReason(*update) : Json(), echoed, streamed,
         ids = std::move(ids)] {
          return self->RenderEvent(index, text, tokens, finish_reason, stop_reason, echoed,
                                   streamed, ids);
        });
  }

  // An event's ids (return_token_ids): its generated ids, and the prompt's
  // in the choice's first event.
  struct TokenIds {
    std::vector<int32_t> prompt;
    std::vector<int32_t> generated;
  };

  static void AppendIds(const std::vector<GeneratedTokenInfo>& tokens, std::vector<int32_t>* ids) {
    for (const GeneratedTokenInfo& token : tokens) ids->push_back(token.token_id);
  }

  // The connection's I/O thread, one event at a time in the order of the
  // updates. Without mu_, so that the engine thread never waits for a
  // (niced) I/O thread: it reads what does not change once the call has
  // started, and the choice's text_offset, which in a streamed call nothing
  // else uses.
  std::string RenderEvent(int index, const std::string& text,
                          const std::vector<GeneratedTokenInfo>& tokens,
                          std::optional<FinishReason> finish_reason, const Json& stop_reason,
                          bool echoed, int streamed_tokens, const TokenIds& ids) {
    Json choice = {{"index", index},
                   {"text", text},
                   {"logprobs", nullptr},
                   {"finish_reason", nullptr},
                   {"stop_reason", stop_reason}};
    if (options_.logprobs >= 0 && !tokens.empty()) {
      Choice& c = *choices_[index];
      const TextEnd end = finish_reason ? TextEndOf(*finish_reason, tokens.back().token_id,
                                                    c.stop_token_ids, c.include_stop)
                                        : TextEnd::kOpen;
      choice["logprobs"] = LogprobsObject(*context_.tokenizer, tokens, options_.logprobs,
                                          options_.tokens_as_ids, &c.text_offset, end, echoed);
    }
    if (finish_reason) choice["finish_reason"] = OpenAiFinishReason(*finish_reason);
    if (options_.return_token_ids) {
      if (!ids.prompt.empty()) choice["prompt_token_ids"] = ids.prompt;
      choice["token_ids"] = ids.generated;
    }
    Json chunk = Chunk(Json::array({std::move(choice)}));
    if (options_.continuous_usage) {
      // The choice's own, as vLLM counts them: its prompt and its tokens so far.
      const int prompt = choices_[index]->prompt_tokens;
      chunk["usage"] = {{"prompt_tokens", prompt},
                        {"completion_tokens", streamed_tokens},
                        {"total_tokens", prompt + streamed_tokens}};
    }
    return Event(chunk);
  }

  // Engine thread. Every prompt has finished: the response (or its end), the
  // access log. True when the call is done; false when a render thread
  // renders the unary response, and ends the call (RenderResponse), or a
  // stream's end is logged, and the call ended, on the connection's I/O
  // thread (LogStreamEnd).
  bool FinishLocked() {
    absl::Status failure;
    bool cancelled = false;
    int prompt_tokens = 0, completion_tokens = 0, cached_prompt_tokens = 0;
    for (size_t i = 0; i < choices_.size(); ++i) {
      const GenerationUpdate& last = *choices_[i]->final_update;
      if (!last.status.ok() && failure.ok()) failure = last.status;
      cancelled |= last.finish_reason == FinishReason::kCancelled;
      // A prompt's tokens once, however many choices it has (as OpenAI
      // counts them).
      if (i % options_.n == 0) {
        prompt_tokens += last.prompt_tokens;
        cached_prompt_tokens += last.cached_prompt_tokens;
      }
      completion_tokens += last.completion_tokens;
      access_.queue_ms = std::max(access_.queue_ms, last.queue_ms);
      access_.time_to_first_token_ms =
          std::max(access_.time_to_first_token_ms, last.time_to_first_token_ms);
      access_.total_ms = std::max(access_.total_ms, last.total_ms);
    }
    access_.prompt_tokens = prompt_tokens;
    access_.completion_tokens = completion_tokens;
    access_.cached_prompt_tokens = cached_prompt_tokens;
    access_.finish_reason = choices_[0]->final_update->finish_reason;
    if (failure.ok() && cancelled && !gone_) {
      // Cancelled by the server: the drain timeout passed.
      failure = absl::UnavailableError("the server stopped before the request finished");
    }
    if (!gone_ && !options_.stream && failure.ok()) {
      // Every choice's text and logprobs as JSON, for a thousand prompts a
      // hundred megabytes and a second or more: not on the engine thread.
      // Nothing but ClientGone changes the call from now on.
      context_.render_threads->Post([self = shared_from_this()] { self->RenderResponse(); });
      return false;
    }
    if (!gone_ && options_.stream) {
      // Logged and counted on the connection's I/O thread once the last
      // events have been written to the socket, before [DONE]: with
      // `failure`'s status, unless the connection is closed first, its
      // client having left or stopped reading with them unwritten
      // (ClientGone). The call ends then.
      stream_end_ = failure.code();
      if (!failure.ok()) exchange_->Write(Event(MakeApiError(failure).body));
      if (failure.ok() && options_.include_usage) {
        Json last = Chunk(Json::array());
        last["usage"] = Usage();
        exchange_->Write(Event(last));
      }
      exchange_->WhenWritten([self = shared_from_this()] {
        bool done = false;
        {
          std::lock_guard<std::mutex> lock(self->mu_);
          if (!self->stream_logged_) {
            self->LogStreamEnd(*self->stream_end_, 200);  // 200: sent with the stream's head
            done = true;
          }
        }
        if (done) self->context_.gate->CallDone();
      });
      exchange_->Write("data: [DONE]\n\n");
      exchange_->End();
      return false;
    }
    // The request once, whatever its number of prompts, before the response
    // goes out (RejectLocked says why).
    if (context_.metrics != nullptr) {
      context_.metrics->RecordRequest(RequestProtocol::kHttp, gone_ ? gone_code_ : failure.code());
    }
    if (gone_) {
      access_.status = gone_code_;
      access_.http_status = HttpStatusFor(gone_code_);
    } else {
      RespondErrorLocked(failure);
    }
    LogAccess(access_);
    return true;
  }

  // A stream's end, once: its count and its access-log line.
  void LogStreamEnd(absl::StatusCode code, int http_status) {
    stream_logged_ = true;
    if (context_.metrics != nullptr) context_.metrics->RecordRequest(RequestProtocol::kHttp, code);
    access_.status = code;
    access_.http_status = http_status;
    LogAccess(access_);
  }

  // The response's tokens (with echo_only none, though the access log counts
  // the one the engine generated), and the prompt tokens found in the prefix
  // cache where there were any (OpenAI's prompt_tokens_details).
  Json Usage() const {
    const int completion_tokens = options_.echo_only ? 0 : access_.completion_tokens;
    Json usage = {{"prompt_tokens", access_.prompt_tokens},
                  {"completion_tokens", completion_tokens},
                  {"total_tokens", access_.prompt_tokens + completion_tokens}};
    if (access_.cached_prompt_tokens > 0) {
      usage["prompt_tokens_details"] = {{"cached_tokens", access_.cached_prompt_tokens}};
    }
    return usage;
  }

  // A render thread: the unary response of a call whose prompts all
  // finished well (FinishLocked), its count, its access-log line and its end
  // in the gate. Without mu_ but for gone_: every prompt has its final
  // update, so nothing else reads or writes the choices or access_ now. The
  // response holds its bytes of the output budget until it is written: one
  // that does not fit is answered 429 instead, or 400 if it is larger than
  // the whole budget.
  void RenderResponse() {
    absl::StatusCode code = absl::StatusCode::kOk;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (gone_) code = gone_code_;
    }
    HttpResponse response;
    if (code == absl::StatusCode::kOk) {  // no work for a client that left
      ByteReservation held(context_.output_budget);
      absl::StatusOr<std::string> body = RenderBody(&held);
      if (body.ok()) {
        response = {.status = 200,
                    .headers = {{"x-request-id", access_.request_id}},
                    .body = *std::move(body),
                    .held = std::move(held)};
      } else {
        code = body.status().code();
        ApiError error = MakeApiError(body.status());
        response = {.status = error.http_status,
                    .headers = {{"x-request-id", access_.request_id}},
                    .body = Dump(error.body)};
      }
    }
    if (context_.metrics != nullptr) context_.metrics->RecordRequest(RequestProtocol::kHttp, code);
    access_.status = code;
    access_.http_status = code == absl::StatusCode::kOk ? 200 : HttpStatusFor(code);
    if (response.status != 0) exchange_->Respond(std::move(response));
    LogAccess(access_);
    context_.gate->CallDone();
  }

  // The unary response's JSON (every choice's text and logprobs, and the
  // usage), rendered a choice at a time and held in `held` as it grows: as
  // one JSON tree, a response of 1000 prompts with 20 logprobs took about
  // five times its 119 MB before its size was known, and a container of
  // 512 MiB ended in the OOM killer. Once it does not fit, what is rendered
  // is counted and dropped, to the end: one larger than the whole budget,
  // which never would fit (not a 429 that clients retry, generating it
  // again each time), is INVALID_ARGUMENT with its size, whether or not
  // other clients' output held it back first; one that only does not fit
  // beside the output held for other clients is RESOURCE_EXHAUSTED.
  absl::StatusOr<std::string> RenderBody(ByteReservation* held) {
    std::string body = Dump(Head());  // {"id":…,"model":…}
    body.back() = ',';
    body += "\"choices\":[";
    int64_t unheld = -1;  // the bytes, once they did not fit
    auto append = [&](std::string_view piece) {
      const auto bytes = static_cast<int64_t>(body.size() + piece.size());
      if (unheld >= 0) {
        unheld += static_cast<int64_t>(piece.size());
      } else if (!held->GrowTo(bytes)) {
        unheld = bytes;  // counted on to the end, for the status
        std::string().swap(body);
        held->ShrinkTo(0);
      } else {
        body.append(piece);
      }
    };
    for (size_t i = 0; i < choices_.size(); ++i) {
      std::string choice = i > 0 ? "," : "";
      choice += Dump(ChoiceObject(i));
      append(choice);
    }
    append(absl::StrCat("],\"usage\":", Dump(Usage()), "}"));
    if (unheld < 0) return body;
    // Refused by a budget (a reservation without one refuses nothing).
    return ResponseRefusal(unheld, *context_.output_budget);
  }

  // Choice `i` of the unary response, its text and logprobs moved out.
  Json ChoiceObject(size_t i) {
    Choice& choice = *choices_[i];
    Json logprobs = nullptr;
    if (options_.logprobs >= 0) {
      const TextEnd end =
          choice.tokens.empty()
              ? TextEnd::kAfterLast
              : TextEndOf(choice.final_update->finish_reason, choice.tokens.back().token_id,
                          choice.stop_token_ids, choice.include_stop);
      logprobs = LogprobsObject(*context_.tokenizer, choice.tokens, options_.logprobs,
                                options_.tokens_as_ids, &choice.text_offset, end, options_.echo);
    }
    Json object = {{"index", i},
                   {"text", std::move(choice.text)},
                   {"logprobs", std::move(logprobs)},
                   {"finish_reason", OpenAiFinishReason(choice.final_update->finish_reason)},
                   {"stop_reason", StopReason(*choice.final_update)}};
    if (options_.prompt_logprobs >= 0) {
      object["prompt_logprobs"] =
          PromptLogprobsObject(*context_.tokenizer, choice.prompt_logprobs,
                               options_.prompt_logprobs, options_.tokens_as_ids);
    }
    if (options_.return_token_ids) {
      object["prompt_token_ids"] = std::move(choice.prompt_ids);
      object["token_ids"] = std::move(choice.token_ids);
    }
    return object;
  }

  void RespondErrorLocked(const absl::Status& status) {
    ApiError error = MakeApiError(status);
    access_.status = status.code();
    access_.http_status = error.http_status;
    exchange_->Respond({.status = error.http_status,
                        .headers = {{"x-request-id", access_.request_id}},
                        .body = Dump(error.body)});
  }

  // The engine refused the prompts: answered now, counted here (the
  // engine's observer counts no HTTP request, and none of them was queued).
  // Counted before the response goes out: a client that reads the metrics
  // after its answer finds the request there.
  void RejectLocked(const absl::Status& status) {
    if (context_.metrics != nullptr) {
      context_.metrics->RecordRequest(RequestProtocol::kHttp, status.code());
    }
    RespondErrorLocked(status);
    LogAccess(access_);
  }

  const CompletionCallContext context_;
  const std::shared_ptr<HttpExchange> exchange_;
  const CompletionOptions options_;
  const int64_t created_;

  std::mutex mu_;
  AccessRecord access_;
  std::vector<std::unique_ptr<Choice>> choices_;
  int remaining_ = 0;      // submitted prompts without their final update
  bool rejected_ = false;  // answered with the engine's refusal
  bool gone_ = false;      // the response cannot be completed (ClientGone)
  absl::StatusCode gone_code_ = absl::StatusCode::kOk;  // why, once gone_
  // A stream whose prompts have all finished: the status its end is logged
  // with once its last events are written (FinishLocked).
  std::optional<absl::StatusCode> stream_end_;
  bool stream_logged_ = false;  // LogStreamEnd has run
};

}  // namespace

void StartCompletionCall(const CompletionCallContext& context,
                         std::shared_ptr<HttpExchange> exchange, CompletionOptions options,
                         std::vector<GenerationRequest> prompts, AccessRecord access) {
  auto call = std::make_shared<CompletionCall>(context, std::move(exchange), options,
                                               static_cast<int>(prompts.size()), std::move(access));
  call->Start(std::move(prompts));
}

}  // namespace switchserve
