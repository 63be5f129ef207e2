#include "server/generate_calls.h"

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "grpc/grpc.h"
#include "server/access_log.h"
#include "server/engine_request_handle.h"
#include "server/generation_service.h"
#include "server/proto_convert.h"
#include "server/wire_format.h"

namespace switchserve {
namespace {

// What the access log says about a call, before it ends.
AccessRecord CallAccessRecord(const grpc::CallbackServerContext& context,
                              const GenerationRequest& request, const char* method) {
  AccessRecord record;
  record.request_id = request.origin.request_id;
  record.protocol = "grpc";
  record.method = method;
  record.peer = context.peer();
  record.priority = request.priority;
  return record;
}

// A stream past --max-stream-buffer-bytes is ended only once its write in
// flight has waited this long: its client has taken none of it meanwhile
// (gRPC tells no more of what a client reads). A write to a reading client
// completes within milliseconds, or a round trip where it waits for the
// client's flow-control window.
constexpr std::chrono::milliseconds kNotReadingAfter{100};

std::string FormatSeconds(std::chrono::steady_clock::duration d) {
  return absl::StrCat(std::chrono::duration_cast<std::chrono::milliseconds>(d).count() / 1000.0,
                      " s");
}

// A call's cancel from a thread of ours (RESOURCE_EXHAUSTED: its client
// reads nothing) while gRPC may be finishing the call: gRPC frees the call
// when OnDone returns, so OnDone waits for a cancel under way on another
// thread (OnDone may also run inside the cancel, on its thread). Guarded by
// its owner's mutex.
class ServerCancel {
 public:
  // Under the owner's mutex, before OnDone: a cancel is under way on this
  // thread; Run it next, outside the mutex.
  void StartLocked() {
    under_way_ = true;
    thread_ = std::this_thread::get_id();
  }
  void Run(grpc::CallbackServerContext* context, const std::string& message, std::mutex* mu) {
    grpc_call_cancel_with_status(context->c_call(), GRPC_STATUS_RESOURCE_EXHAUSTED, message.c_str(),
                                 nullptr);
    {
      std::lock_guard<std::mutex> lock(*mu);
      under_way_ = false;
      thread_ = std::thread::id();
    }
    ended_.notify_all();
  }
  // OnDone, under the owner's mutex (`lock`).
  void WaitLocked(std::unique_lock<std::mutex>* lock) {
    if (thread_ != std::this_thread::get_id()) ended_.wait(*lock, [&] { return !under_way_; });
  }
  bool under_way() const { return under_way_; }

 private:
  std::condition_variable ended_;  // under_way_ cleared
  bool under_way_ = false;
  std::thread::id thread_;
};

// Forwards the engine's updates to a call object that outlives the request.
template <typename Call>
class CallSink : public GenerationSink {
 public:
  explicit CallSink(Call* call) : call_(call) {}
  void OnUpdate(GenerationUpdate update) override { call_->OnEngineUpdate(std::move(update)); }

 private:
  Call* call_;
};

// What a Generate call and a GenerateStream call share: the service, the
// engine request, the access record, the output budget's reservation, and
// their end. gRPC's OnCancel cancels the engine request; the call is deleted
// once gRPC (OnDone) and everything else holding it are done with it; OnDone
// waits for a cancel under way on another thread (ServerCancel). Each final
// class adds itself to the service's StreamRegistry in its constructor and
// removes itself in its destructor, so that the sweep never sees it half
// made or half gone.
class GenerateCall : public QueuedWrite, public StreamRegistry::Member {
 protected:
  // `holds`: who holds the call at first (gRPC, and the engine where it
  // releases the call too).
  GenerateCall(GenerationService* service, grpc::CallbackServerContext* context,
               const GenerationRequest& request, const char* method, int holds)
      : service_(service),
        context_(context),
        params_(request.sampling),
        access_(CallAccessRecord(*context, request, method)),
        held_(service->output_budget()),
        holds_(holds) {
    service_->CallStarted();
  }

  // gRPC's OnCancel.
  void CancelRequest() { handle_.Cancel(CancelCauseOf(*context_)); }

  // gRPC's OnDone.
  void Done() {
    {
      std::unique_lock<std::mutex> lock(mu_);
      done_ = true;
      cancel_.WaitLocked(&lock);
    }
    service_->CallDone();
    Release();
  }

  // Drops one hold; the last deletes the call.
  void Release() {
    bool delete_now;
    {
      std::lock_guard<std::mutex> lock(mu_);
      delete_now = --holds_ == 0;
    }
    if (delete_now) delete this;
  }

  GenerationService* const service_;
  grpc::CallbackServerContext* const context_;
  const SamplingParams params_;
  AccessRecord access_;
  EngineRequestHandle handle_;
  ByteReservation held_;  // the output the call holds against the budget

  std::mutex mu_;
  int holds_;  // guarded by mu_
  // Ending a call whose client does not read (guarded by mu_).
  bool ending_ = false;
  std::string end_message_;
  ServerCancel cancel_;
  bool done_ = false;  // OnDone has run (or is waiting for the cancel)
};

// A unary call holds its serialized response against the output budget
// (--output-buffer-bytes) from the end of its request until gRPC is done with
// it: a client that reads nothing (HTTP/2 flow control) keeps the response in
// the server. One that does not fit there is refused (RESOURCE_EXHAUSTED, or
// INVALID_ARGUMENT when it is larger than the whole budget), and one whose
// client has taken nothing of it for the service's write timeout is ended
// RESOURCE_EXHAUSTED (found by the registry's sweep, cancelled on the
// WriteQueue thread). As every call, it is logged and counted as its answer
// is handed to gRPC (GenerationService::FinishCall).
class UnaryGenerateCall final : public grpc::ServerUnaryReactor, public GenerateCall {
 public:
  UnaryGenerateCall(GenerationService* service, grpc::CallbackServerContext* context,
                    grpc::ByteBuffer* response, const GenerationRequest& request)
      : GenerateCall(service, context, request, "Generate", /*holds=*/1), response_(response) {
    service_->streams().Add(this);
  }
  ~UnaryGenerateCall() override { service_->streams().Remove(this); }

  void Start(GenerationRequest request) {
    request.sink = std::make_shared<CallSink<UnaryGenerateCall>>(this);
    absl::Status status = handle_.Submit(service_->engine(), std::move(request));
    if (!status.ok()) {
      access_.status = status.code();
      service_->FinishCall(access_);
      Finish(ToGrpcStatus(status));
    }
  }

  // Engine thread.
  void OnEngineUpdate(GenerationUpdate update) {
    message_.mutable_text()->append(update.text);
    // The tokens' detail is kept serialized, as a stream's is: as protobuf
    // objects it takes about nine times its bytes.
    v1::GenerateResponse detail;
    AppendTokens(update, params_, service_->describer(), message_.mutable_token_ids(),
                 detail.mutable_tokens());
    AppendPromptTokens(update, service_->describer(), detail.mutable_prompt_tokens());
    if (detail.tokens_size() > 0 || detail.prompt_tokens_size() > 0) {
      detail.AppendToString(&detail_);
    }
    if (!update.finished) return;
    FillFromFinalUpdate(update, &access_);
    grpc::Status status;
    int64_t response_bytes = 0;  // of a response given to Finish (held)
    if (!update.status.ok()) {
      status = ToGrpcStatus(update.status);
    } else if (update.finish_reason == FinishReason::kCancelled) {
      status = CancelledCallStatus(update.cancel_cause);
    } else {
      message_.set_finish_reason(ToProto(update.finish_reason));
      SetStopReason(update, &message_);
      FillUsageAndTiming(update, message_.mutable_usage(), message_.mutable_timing());
      *response_ = SerializeMessage(message_, detail_);
      // Freed, not cleared: the call lives until its client has the response.
      message_ = v1::GenerateResponse();
      std::string().swap(detail_);
      const auto bytes = static_cast<int64_t>(response_->Length());
      if (held_.GrowTo(bytes)) {
        response_bytes = bytes;
      } else {
        status = ToGrpcStatus(ResponseRefusal(bytes, *service_->output_budget()));
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      response_bytes_ = response_bytes;
      finish_called_at_ = std::chrono::steady_clock::now();
    }
    access_.status = static_cast<absl::StatusCode>(status.error_code());
    service_->FinishCall(access_);
    Finish(status);
  }

  // Ends the call (RESOURCE_EXHAUSTED) if its response has waited for its
  // client since before `started_before`. Under the registry's lock
  // (StreamRegistry::Sweep): the call is not deleted meanwhile. gRPC does
  // not say how much of the response its client has taken: one still
  // reading a response too large for its link is ended too, so the message
  // says only that the client had not finished reading it.
  void EndIfStalled(std::chrono::steady_clock::time_point started_before) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (response_bytes_ == 0 || ending_ || done_ || finish_called_at_ >= started_before) return;
      ending_ = true;
      end_message_ = absl::StrCat(
          "the call's client had not finished reading its response (", response_bytes_,
          " bytes) after ", FormatSeconds(std::chrono::steady_clock::now() - finish_called_at_));
      ++holds_;
    }
    service_->write_queue().Post(this);
  }

  // WriteQueue thread: cancels the call that EndIfStalled ended.
  void RunQueuedWrite() override {
    std::string end_message;
    {
      std::lock_guard<std::mutex> lock(mu_);
      // Until OnDone the call is gRPC's to cancel.
      if (!done_) {
        cancel_.StartLocked();
        end_message = end_message_;
      }
    }
    if (!end_message.empty()) cancel_.Run(context_, end_message, &mu_);
    Release();
  }

  void OnCancel() override { CancelRequest(); }
  // The call is deleted once gRPC and a posted cancel are done with it (held_
  // holds the serialized response while gRPC has it).
  void OnDone() override { Done(); }

 private:
  grpc::ByteBuffer* response_;
  v1::GenerateResponse message_;  // built up by the updates, but
  std::string detail_;            // its `tokens`, serialized

  // Guarded by mu_. ending_: ended by the sweep, its client had not read the
  // response.
  int64_t response_bytes_ = 0;  // of the response given to Finish; 0: a status alone
  std::chrono::steady_clock::time_point finish_called_at_;
};

// Streams updates as they come. The engine thread merges each update into the
// pending message and posts the call to the service's WriteQueue, whose thread
// serializes and starts the write; while a write is in flight, further updates
// are merged into the next message, so a slow reader gets fewer, larger
// messages instead of an unbounded queue.
//
// A client that stops reading (HTTP/2 flow control) would keep its call, and
// everything merged for it, forever. So a stream is ended RESOURCE_EXHAUSTED
// (its engine request cancelled, gRPC's call cancelled with that status, so
// that the stuck write fails) once a write has waited longer than the
// service's timeout (found by the registry's sweep) or once what is merged
// while it waits passes the service's byte limit (found by the engine thread
// as it merges; the rest is done on the WriteQueue thread, not the engine's).
class StreamingGenerateCall final : public grpc::ServerWriteReactor<grpc::ByteBuffer>,
                                    public GenerateCall {
 public:
  StreamingGenerateCall(GenerationService* service, grpc::CallbackServerContext* context,
                        const GenerationRequest& request)
      : GenerateCall(service, context, request, "GenerateStream", /*holds=*/2),
        detail_(request.sampling.logprobs > 0 || request.sampling.return_routing) {
    service_->streams().Add(this);
  }
  ~StreamingGenerateCall() override { service_->streams().Remove(this); }

  void Start(GenerationRequest request) {
    request.sink = std::make_shared<CallSink<StreamingGenerateCall>>(this);
    absl::Status status = handle_.Submit(service_->engine(), std::move(request));
    if (!status.ok()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        access_.status = status.code();
        finished_ = true;
        final_status_ = ToGrpcStatus(status);
      }
      Pump();
      Release();  // the engine never saw it
    }
  }

  // Engine thread.
  void OnEngineUpdate(GenerationUpdate update) {
    bool post = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (update.finished) FillFromFinalUpdate(update, &access_);
      if (!update.status.ok()) {
        final_status_ = ToGrpcStatus(update.status);
      } else if (!ending_) {  // an ending stream's output goes nowhere
        pending_.mutable_text()->append(update.text);
        // The tokens' detail is kept serialized (`tokens` and
        // `prompt_tokens` entries): as
        // protobuf objects it takes about nine times the bytes the budgets
        // count, which a stream whose client reads nothing holds.
        v1::GenerateStreamResponse detail;
        AppendTokens(update, params_, service_->describer(), pending_.mutable_token_ids(),
                     detail.mutable_tokens());
        AppendPromptTokens(update, service_->describer(), detail.mutable_prompt_tokens());
        const size_t detail_before = pending_detail_.size();
        if (detail_ || detail.prompt_tokens_size() > 0) detail.AppendToString(&pending_detail_);
        has_pending_ = true;
        // The serialized size: near enough for the text and ids (ids as 5
        // bytes), the detail's exactly; from the new entries only.
        pending_bytes_ += static_cast<int64_t>(update.text.size() + 5 * update.tokens.size() +
                                               (pending_detail_.size() - detail_before));
        if (update.finished) {
          pending_.set_finished(true);
          pending_.set_finish_reason(ToProto(update.finish_reason));
          SetStopReason(update, &pending_);
          FillUsageAndTiming(update, pending_.mutable_usage(), pending_.mutable_timing());
          final_status_ = update.finish_reason == FinishReason::kCancelled
                              ? CancelledCallStatus(update.cancel_cause)
                              : grpc::Status::OK;
        }
        if (PastBufferLimitLocked()) {
          EndLocked(StreamOutputPastLimitMessage(service_->max_stream_buffer_bytes()));
        } else if (!held_.GrowTo(pending_bytes_ + in_flight_bytes_)) {
          EndLocked(OutputBudgetFullMessage(*service_->output_budget()));
        }
      }
      finished_ = update.finished;
      // A write in flight picks the update up when it completes; a posted
      // call has not run yet and will. An ending stream is posted whatever
      // it writes, to be cancelled.
      if ((!writing_ && !finish_called_) || end_requested_) post = PostLocked();
    }
    if (post) service_->write_queue().Post(this);
    if (update.finished) Release();
  }

  // Ends the stream (RESOURCE_EXHAUSTED) if a write of it has been
  // outstanding since before `started_before`, or if its client is not
  // reading with more than --max-stream-buffer-bytes waiting: that is
  // looked at with each engine update, and here for a stream whose request
  // finished before its write had waited long enough to tell. Under the
  // registry's lock (StreamRegistry::Sweep): the call is not deleted
  // meanwhile, as its destructor takes that lock first.
  void EndIfStalled(std::chrono::steady_clock::time_point started_before) override {
    bool post = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      // holds_ == 0: being deleted, past any write.
      if (holds_ == 0 || ending_ || done_ || !writing_) return;
      if (write_started_ < started_before) {
        // A client may be reading a large message slowly: that it read
        // nothing is more than gRPC tells.
        EndLocked("the stream's client had not finished reading a message for " +
                  FormatSeconds(std::chrono::steady_clock::now() - write_started_));
      } else if (PastBufferLimitLocked()) {
        EndLocked(StreamOutputPastLimitMessage(service_->max_stream_buffer_bytes()));
      } else {
        return;
      }
      post = PostLocked();
    }
    if (post) service_->write_queue().Post(this);
  }

  // WriteQueue thread.
  void RunQueuedWrite() override {
    std::string end_message;
    bool cancel = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      posted_ = false;
      // Until OnDone the call is gRPC's to cancel.
      if (end_requested_ && !done_) {
        end_requested_ = false;
        cancel_.StartLocked();
        end_message = end_message_;
        cancel = true;
      }
    }
    if (cancel) {
      // The engine frees the request's KV blocks at its next step; the
      // stuck write fails (OnWriteDone(false)), and the client gets the
      // status in trailers, which flow control does not hold back.
      handle_.Cancel(CancelCause::kClient);
      cancel_.Run(context_, end_message, &mu_);
    }
    Pump();
    Release();
  }

  void OnWriteDone(bool ok) override {
    // While writing_ is set the call cannot finish, so `this` stays valid.
    // A failed write: the client is gone, having cancelled or seen its
    // deadline pass, or the drain's timeout ended the call. This can come
    // before OnCancel does, so it tells which.
    CancelCause cause = CancelCause::kNone;
    if (!ok) {
      cause = service_->ending_running_calls() ? CancelCause::kShutdown : CancelCauseOf(*context_);
    }
    if (!ok) handle_.Cancel(cause);
    {
      std::lock_guard<std::mutex> lock(mu_);
      writing_ = false;
      in_flight_bytes_ = 0;
      held_.ShrinkTo(pending_bytes_);
      if (!ok) {
        broken_ = true;
        broken_cause_ = cause;
      }
    }
    Pump();
  }
  void OnCancel() override { CancelRequest(); }
  // The call is deleted once gRPC, the engine (its final update has
  // returned) and every posted write are done with it: the engine thread may
  // still be in OnEngineUpdate, and the queue may still hold the call, when a
  // gRPC thread finishes it.
  void OnDone() override { Done(); }

 private:
  // Starts the next write (the last one together with the call's end), or
  // finishes once everything is written. The message is serialized and gRPC
  // is called outside the lock, so the engine thread never waits for them.
  void Pump() {
    enum { kNothing, kWrite, kWriteAndFinish, kFinish } action = kNothing;
    grpc::Status status;
    v1::GenerateStreamResponse message;
    std::string detail;  // message's `tokens`, serialized
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (writing_ || finish_called_ || cancel_.under_way()) return;
      if (has_pending_ && !broken_ && !ending_) {
        message.Swap(&pending_);
        detail.swap(pending_detail_);
        has_pending_ = false;
        in_flight_bytes_ = pending_bytes_;
        pending_bytes_ = 0;
        writing_ = true;
        write_started_ = std::chrono::steady_clock::now();
        action = kWrite;
        if (finished_) {
          finish_called_ = true;
          status = final_status_;
          action = kWriteAndFinish;
          access_.status = static_cast<absl::StatusCode>(status.error_code());
        }
      } else if (finished_) {
        finish_called_ = true;
        action = kFinish;
        if (ending_) {
          // Ended by the server: RESOURCE_EXHAUSTED, as gRPC's cancel
          // told the client, whatever the engine said.
          status = grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, end_message_);
          access_.status = absl::StatusCode::kResourceExhausted;
        } else {
          status = final_status_;
          // A broken stream ends as its client saw it, CANCELLED or
          // DEADLINE_EXCEEDED, whatever the engine said.
          access_.status = static_cast<absl::StatusCode>(
              (broken_ ? CancelledCallStatus(broken_cause_) : status).error_code());
        }
      }
    }
    if (action == kWrite || action == kWriteAndFinish) {
      in_flight_ = SerializeMessage(message, detail);
    }
    if (action == kWriteAndFinish || action == kFinish) {
      // access_ is no longer written once finish_called_ is set.
      service_->FinishCall(access_);
    }
    if (action == kWrite) StartWrite(&in_flight_);
    if (action == kWriteAndFinish) StartWriteAndFinish(&in_flight_, grpc::WriteOptions(), status);
    if (action == kFinish) Finish(status);
  }

  // Marks the stream as ending (the WriteQueue thread then cancels it):
  // nothing more is merged or written, and what is pending is dropped.
  void EndLocked(std::string message) {
    ending_ = true;
    end_requested_ = true;
    end_message_ = std::move(message);
    pending_.Clear();
    std::string().swap(pending_detail_);
    has_pending_ = false;
    pending_bytes_ = 0;
    held_.ShrinkTo(in_flight_bytes_);
  }

  // Whether the stream holds more than --max-stream-buffer-bytes for a
  // client that is not reading: merged output and the message being
  // written (all of it may have gone into one write, which then waits).
  bool PastBufferLimitLocked() const {
    return pending_bytes_ + in_flight_bytes_ > service_->max_stream_buffer_bytes() &&
           ClientNotReadingLocked();
  }

  // Whether the stream's client is not reading: a write has waited
  // kNotReadingAfter. Output waiting for the server's own threads (no write
  // in flight: the call is in the write queue, or a write completes now)
  // does not wait for the client, which then reads what it is given. It
  // counts against the budget all streams share (held_) alone.
  bool ClientNotReadingLocked() const {
    return writing_ && std::chrono::steady_clock::now() - write_started_ >= kNotReadingAfter;
  }

  // Whether to post the call to the WriteQueue (not if it is there already).
  bool PostLocked() {
    if (posted_) return false;
    posted_ = true;
    ++holds_;
    return true;
  }

  const bool detail_;  // the messages carry tokens' detail (AppendTokens)

  // Guarded by mu_, as access_ is here. holds_: gRPC and the engine, plus
  // one per posted write. held_: pending_bytes_ + in_flight_bytes_.
  v1::GenerateStreamResponse pending_;                   // merged updates not yet written, but
  std::string pending_detail_;                           // their `tokens`, serialized
  int64_t pending_bytes_ = 0;                            // their serialized size, about
  grpc::ByteBuffer in_flight_;                           // the message being written
  int64_t in_flight_bytes_ = 0;                          // its pending_bytes_ when taken
  std::chrono::steady_clock::time_point write_started_;  // of the write in flight
  bool has_pending_ = false;
  bool writing_ = false;
  bool posted_ = false;                            // in the write queue, not run yet
  bool broken_ = false;                            // a write failed: the client is gone
  CancelCause broken_cause_ = CancelCause::kNone;  // why, as CancelCauseOf tells
  bool finished_ = false;
  bool finish_called_ = false;
  grpc::Status final_status_;
  // Ending a stream whose client does not read (EndLocked; ending_ too).
  bool end_requested_ = false;  // the WriteQueue thread has yet to cancel it
};

}  // namespace

void StreamRegistry::Add(Member* member) {
  std::lock_guard<std::mutex> lock(mu_);
  member->next_ = head_;
  if (head_ != nullptr) head_->prev_ = member;
  head_ = member;
}

void StreamRegistry::Remove(Member* member) {
  std::lock_guard<std::mutex> lock(mu_);
  if (member->prev_ != nullptr) member->prev_->next_ = member->next_;
  if (member->next_ != nullptr) member->next_->prev_ = member->prev_;
  if (head_ == member) head_ = member->next_;
}

void StreamRegistry::Sweep(std::chrono::steady_clock::duration timeout) {
  const auto started_before = std::chrono::steady_clock::now() - timeout;
  std::lock_guard<std::mutex> lock(mu_);
  for (Member* member = head_; member != nullptr; member = member->next_) {
    member->EndIfStalled(started_before);
  }
}

CancelCause CancelCauseOf(const grpc::CallbackServerContext& context) {
  // A client whose deadline passes cancels the call itself, at its own clock;
  // that cancellation reaches the server a little before the server's copy
  // of the deadline (computed from the header's arrival) passes. Count a
  // cancellation that close to the deadline as the deadline the client saw.
  // (A deadline past the year 2262 looked already past on the time_point.)
  const std::optional<gpr_timespec> left = TimeToDeadline(context);
  return left && gpr_time_cmp(*left, gpr_time_from_millis(100, GPR_TIMESPAN)) <= 0
             ? CancelCause::kDeadline
             : CancelCause::kClient;
}

std::optional<gpr_timespec> TimeToDeadline(const grpc::ServerContextBase& context) {
  const gpr_timespec raw = context.raw_deadline();
  if (gpr_time_cmp(raw, gpr_inf_future(raw.clock_type)) == 0) return std::nullopt;
  return gpr_time_sub(raw, gpr_now(raw.clock_type));
}

grpc::Status CancelledCallStatus(CancelCause cause) {
  switch (cause) {
    case CancelCause::kDeadline:
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "deadline exceeded");
    case CancelCause::kShutdown:
      return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          "the server stopped before the request finished");
    case CancelCause::kClient:
    case CancelCause::kNone:
      break;
  }
  return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
}

grpc::ServerUnaryReactor* StartUnaryGenerate(GenerationService* service,
                                             grpc::CallbackServerContext* context,
                                             GenerationRequest request,
                                             grpc::ByteBuffer* response) {
  auto* call = new UnaryGenerateCall(service, context, response, request);
  call->Start(std::move(request));
  return call;
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* StartStreamingGenerate(
    GenerationService* service, grpc::CallbackServerContext* context, GenerationRequest request) {
  auto* call = new StreamingGenerateCall(service, context, request);
  call->Start(std::move(request));
  return call;
}

}  // namespace switchserve
