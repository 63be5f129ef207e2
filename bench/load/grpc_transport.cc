#include "bench/load/grpc_transport.h"

#include <pthread.h>

#include <chrono>
#include <utility>

#include "grpcpp/client_context.h"
#include "grpcpp/support/async_stream.h"

namespace switchserve::bench {

// One streaming call driven by the transport's completion queue: at most one
// operation of it is pending at a time, so the call itself is the tag, and
// `Proceed` runs on the queue's thread only.
class GrpcTransport::StreamCall {
 public:
  StreamCall(v1::GenerateRequest request, const std::string& token, double timeout_s,
             RequestProgress* progress)
      : request_(std::move(request)), progress_(progress) {
    context_.set_deadline(std::chrono::system_clock::now() +
                          std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
    if (!token.empty()) context_.AddMetadata("authorization", "Bearer " + token);
  }

  void Start(v1::Generation::Stub* stub, grpc::CompletionQueue* queue) {
    reader_ = stub->PrepareAsyncGenerateStream(&context_, request_, queue);
    reader_->StartCall(this);
  }

  // The pending operation completed (`ok` as the queue reports it).
  void Proceed(bool ok) {
    switch (state_) {
      case State::kStarting:
      case State::kReading:
        if (state_ == State::kReading && ok) progress_->OnTokens(message_.token_ids_size());
        if (ok) {
          state_ = State::kReading;
          reader_->Read(&message_, this);
        } else {
          // The stream ended (or never started): its status says how.
          state_ = State::kFinishing;
          reader_->Finish(&status_, this);
        }
        return;
      case State::kFinishing: {
        const bool call_ok = status_.ok();
        const std::string error =
            call_ok ? "" : std::to_string(status_.error_code()) + " " + status_.error_message();
        RequestProgress* progress = progress_;
        delete this;
        progress->OnDone(call_ok, error);
        return;
      }
    }
  }

 private:
  enum class State { kStarting, kReading, kFinishing };

  v1::GenerateRequest request_;
  RequestProgress* const progress_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientAsyncReader<v1::GenerateStreamResponse>> reader_;
  v1::GenerateStreamResponse message_;
  grpc::Status status_;
  State state_ = State::kStarting;
};

GrpcTransport::GrpcTransport(std::shared_ptr<grpc::Channel> channel, v1::GenerateRequest request,
                             std::string token, double timeout_s)
    : stub_(v1::Generation::NewStub(channel)),
      request_(std::move(request)),
      token_(std::move(token)),
      timeout_s_(timeout_s),
      thread_([this] { Loop(); }) {}

GrpcTransport::~GrpcTransport() {
  queue_.Shutdown();
  thread_.join();
}

void GrpcTransport::Start(uint64_t seed, RequestProgress* progress) {
  v1::GenerateRequest request = request_;
  request.mutable_sampling()->set_seed(seed);
  if (request.has_token_ids()) VaryTail(seed, *request.mutable_token_ids()->mutable_ids());
  (new StreamCall(std::move(request), token_, timeout_s_, progress))->Start(stub_.get(), &queue_);
}

void GrpcTransport::Loop() {
  pthread_setname_np(pthread_self(), "grpc-client");
  void* tag = nullptr;
  bool ok = false;
  while (queue_.Next(&tag, &ok)) static_cast<StreamCall*>(tag)->Proceed(ok);
}

}  // namespace switchserve::bench
