#include "server/generate_calls.h"

#include <memory>
#include <mutex>
#include <optional>
#include <utility>

#include "server/access_log.h"
#include "server/engine_request_handle.h"
#include "server/generation_service.h"
#include "server/proto_convert.h"
#include "server/wire_format.h"

namespace switchserve {
namespace {

// Forwards the engine's updates to a call object that outlives the request.
// What the access log says about a call, before it ends.
AccessRecord CallAccessRecord(const grpc::CallbackServerContext& context,
                              const GenerationRequest& request, const char* method) {
  AccessRecord record;
  record.request_id = request.origin.request_id;
  record.protocol = "grpc";
  record.method = method;
  record.peer = context.peer();
  return record;
}

template <typename Call>
class CallSink : public GenerationSink {
 public:
  explicit CallSink(Call* call) : call_(call) {}
  void OnUpdate(GenerationUpdate update) override { call_->OnEngineUpdate(std::move(update)); }

 private:
  Call* call_;
};

class UnaryGenerateCall : public grpc::ServerUnaryReactor {
 public:
  UnaryGenerateCall(GenerationService* service, grpc::CallbackServerContext* context,
                    grpc::ByteBuffer* response, const GenerationRequest& request)
      : service_(service),
        context_(context),
        response_(response),
        params_(request.sampling),
        access_(CallAccessRecord(*context, request, "Generate")) {
    service_->CallStarted();
  }

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
    AppendTokens(update, params_, service_->describer(), message_.mutable_token_ids(),
                 message_.mutable_tokens());
    if (!update.finished) return;
    FillFromFinalUpdate(update, &access_);
    if (!update.status.ok()) {
      access_.status = update.status.code();
      service_->FinishCall(access_);
      Finish(ToGrpcStatus(update.status));
      return;
    }
    message_.set_finish_reason(ToProto(update.finish_reason));
    FillUsageAndTiming(update, message_.mutable_usage(), message_.mutable_timing());
    *response_ = SerializeMessage(message_);
    const grpc::Status status = update.finish_reason == FinishReason::kCancelled
                                    ? CancelledCallStatus(update.cancel_cause)
                                    : grpc::Status::OK;
    access_.status = static_cast<absl::StatusCode>(status.error_code());
    service_->FinishCall(access_);
    Finish(status);
  }

  void OnCancel() override { handle_.Cancel(CancelCauseOf(*context_)); }
  void OnDone() override {
    service_->CallDone();
    delete this;
  }

 private:
  GenerationService* service_;
  grpc::CallbackServerContext* context_;
  grpc::ByteBuffer* response_;
  v1::GenerateResponse message_;  // built up by the updates
  SamplingParams params_;
  AccessRecord access_;
  EngineRequestHandle handle_;
};

// Streams updates as they come. The engine thread merges each update into the
// pending message and posts the call to the service's WriteQueue, whose thread
// serializes and starts the write; while a write is in flight, further updates
// are merged into the next message, so a slow reader gets fewer, larger
// messages instead of an unbounded queue.
class StreamingGenerateCall : public grpc::ServerWriteReactor<grpc::ByteBuffer>,
                              public QueuedWrite {
 public:
  StreamingGenerateCall(GenerationService* service, grpc::CallbackServerContext* context,
                        const GenerationRequest& request)
      : service_(service),
        context_(context),
        params_(request.sampling),
        access_(CallAccessRecord(*context, request, "GenerateStream")) {
    service_->CallStarted();
  }

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
      } else {
        pending_.mutable_text()->append(update.text);
        AppendTokens(update, params_, service_->describer(), pending_.mutable_token_ids(),
                     pending_.mutable_tokens());
        has_pending_ = true;
        if (update.finished) {
          pending_.set_finished(true);
          pending_.set_finish_reason(ToProto(update.finish_reason));
          FillUsageAndTiming(update, pending_.mutable_usage(), pending_.mutable_timing());
          final_status_ = update.finish_reason == FinishReason::kCancelled
                              ? CancelledCallStatus(update.cancel_cause)
                              : grpc::Status::OK;
        }
      }
      finished_ = update.finished;
      // A write in flight picks the update up when it completes; a posted
      // call has not run yet and will.
      if (!writing_ && !finish_called_ && !posted_) {
        posted_ = true;
        ++holds_;
        post = true;
      }
    }
    if (post) service_->write_queue().Post(this);
    if (update.finished) Release();
  }

  // WriteQueue thread.
  void RunQueuedWrite() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      posted_ = false;
    }
    Pump();
    Release();
  }

  void OnWriteDone(bool ok) override {
    // While writing_ is set the call cannot finish, so `this` stays valid.
    // A failed write: the client is gone, having cancelled or seen its
    // deadline pass. This can come before OnCancel does, so it tells which.
    const CancelCause cause = ok ? CancelCause::kNone : CancelCauseOf(*context_);
    if (!ok) handle_.Cancel(cause);
    {
      std::lock_guard<std::mutex> lock(mu_);
      writing_ = false;
      if (!ok) {
        broken_ = true;
        broken_cause_ = cause;
      }
    }
    Pump();
  }
  void OnCancel() override { handle_.Cancel(CancelCauseOf(*context_)); }
  void OnDone() override {
    service_->CallDone();
    Release();
  }

 private:
  // Starts the next write (the last one together with the call's end), or
  // finishes once everything is written. The message is serialized and gRPC
  // is called outside the lock, so the engine thread never waits for them.
  void Pump() {
    enum { kNothing, kWrite, kWriteAndFinish, kFinish } action = kNothing;
    grpc::Status status;
    v1::GenerateStreamResponse message;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (writing_ || finish_called_) return;
      if (has_pending_ && !broken_) {
        message.Swap(&pending_);
        has_pending_ = false;
        writing_ = true;
        action = kWrite;
        if (finished_) {
          finish_called_ = true;
          status = final_status_;
          action = kWriteAndFinish;
          access_.status = static_cast<absl::StatusCode>(status.error_code());
        }
      } else if (finished_) {
        finish_called_ = true;
        status = final_status_;
        action = kFinish;
        // A broken stream ends as its client saw it, CANCELLED or
        // DEADLINE_EXCEEDED, whatever the engine said.
        access_.status = static_cast<absl::StatusCode>(
            (broken_ ? CancelledCallStatus(broken_cause_) : status).error_code());
      }
    }
    if (action == kWrite || action == kWriteAndFinish) in_flight_ = SerializeMessage(message);
    if (action == kWriteAndFinish || action == kFinish) {
      // access_ is no longer written once finish_called_ is set.
      service_->FinishCall(access_);
    }
    if (action == kWrite) StartWrite(&in_flight_);
    if (action == kWriteAndFinish) StartWriteAndFinish(&in_flight_, grpc::WriteOptions(), status);
    if (action == kFinish) Finish(status);
  }

  // The call is deleted once gRPC (OnDone), the engine (its final update has
  // returned) and every posted write are done with it: the engine thread may
  // still be in OnEngineUpdate, and the queue may still hold the call, when a
  // gRPC thread finishes it.
  void Release() {
    bool delete_now;
    {
      std::lock_guard<std::mutex> lock(mu_);
      delete_now = --holds_ == 0;
    }
    if (delete_now) delete this;
  }

  GenerationService* service_;
  grpc::CallbackServerContext* context_;
  SamplingParams params_;
  EngineRequestHandle handle_;

  std::mutex mu_;
  int holds_ = 2;  // gRPC and the engine, plus one per posted write
  AccessRecord access_;
  v1::GenerateStreamResponse pending_;  // merged updates not yet written
  grpc::ByteBuffer in_flight_;          // the message being written
  bool has_pending_ = false;
  bool writing_ = false;
  bool posted_ = false;                            // in the write queue, not run yet
  bool broken_ = false;                            // a write failed: the client is gone
  CancelCause broken_cause_ = CancelCause::kNone;  // why, as CancelCauseOf tells
  bool finished_ = false;
  bool finish_called_ = false;
  grpc::Status final_status_;
};

}  // namespace

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
