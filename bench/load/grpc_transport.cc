#include "bench/load/grpc_transport.h"

#include <chrono>
#include <utility>

#include "grpcpp/client_context.h"

namespace switchserve::bench {
namespace {

// One streaming call; deletes itself when done, after telling `progress`.
class StreamCall : public grpc::ClientReadReactor<v1::GenerateStreamResponse> {
 public:
  StreamCall(v1::GenerateRequest request, const std::string& token, double timeout_s,
             RequestProgress* progress)
      : request_(std::move(request)), progress_(progress) {
    context_.set_deadline(std::chrono::system_clock::now() +
                          std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000)));
    if (!token.empty()) context_.AddMetadata("authorization", "Bearer " + token);
  }

  void Start(v1::Generation::Stub* stub) {
    stub->async()->GenerateStream(&context_, &request_, this);
    StartRead(&message_);
    StartCall();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;
    progress_->OnTokens(message_.token_ids_size());
    StartRead(&message_);
  }

  void OnDone(const grpc::Status& status) override {
    const bool ok = status.ok();
    const std::string error =
        ok ? "" : std::to_string(status.error_code()) + " " + status.error_message();
    RequestProgress* progress = progress_;
    delete this;
    progress->OnDone(ok, error);
  }

 private:
  v1::GenerateRequest request_;
  RequestProgress* const progress_;
  grpc::ClientContext context_;
  v1::GenerateStreamResponse message_;
};

}  // namespace

GrpcTransport::GrpcTransport(std::shared_ptr<grpc::Channel> channel, v1::GenerateRequest request,
                             std::string token, double timeout_s)
    : stub_(v1::Generation::NewStub(channel)),
      request_(std::move(request)),
      token_(std::move(token)),
      timeout_s_(timeout_s) {}

void GrpcTransport::Start(uint64_t seed, RequestProgress* progress) {
  v1::GenerateRequest request = request_;
  request.mutable_sampling()->set_seed(seed);
  (new StreamCall(std::move(request), token_, timeout_s_, progress))->Start(stub_.get());
}

}  // namespace switchserve::bench
