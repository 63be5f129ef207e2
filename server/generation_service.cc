#include "server/generation_service.h"

#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "server/generate_calls.h"
#include "server/wire_format.h"

namespace switchserve {
namespace {

// A unary reactor that finishes at once with `status`.
grpc::ServerUnaryReactor* FinishNow(grpc::CallbackServerContext* context,
                                    const grpc::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(status);
  return reactor;
}

// A streaming reactor that finishes at once with `status`.
class FailedStream : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  explicit FailedStream(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace

GenerationService::GenerationService(const GenerationServiceOptions& options) : options_(options) {
  if (options_.gate == nullptr) options_.gate = &own_gate_;
  describer_.tokenizer = options.tokenizer;
  describer_.layout = RouterLayout(*options.config);
}

void GenerationService::FinishRejected(const AccessRecord& record) const {
  if (options_.metrics != nullptr) {
    options_.metrics->RecordFinished({.protocol = RequestProtocol::kGrpc, .status = record.status});
  }
  LogAccess(record);
}

grpc::Status GenerationService::Admit(grpc::CallbackServerContext* context) const {
  if (options_.auth != nullptr) {
    if (grpc::Status status = options_.auth->Check(*context); !status.ok()) return status;
  }
  if (options_.gate->draining()) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "the server is shutting down; retry on another replica");
  }
  return grpc::Status::OK;
}

absl::StatusOr<GenerationRequest> GenerationService::Prepare(grpc::CallbackServerContext* context,
                                                             const grpc::ByteBuffer& buffer) const {
  v1::GenerateRequest request;
  if (absl::Status status = ParseMessage(buffer, &request); !status.ok()) return status;
  auto prepared = ValidateGenerateRequest(request, *options_.tokenizer, options_.limits);
  if (!prepared.ok()) return prepared.status();
  prepared->arrival = Clock::now();
  const auto deadline = context->deadline();
  if (deadline != std::chrono::system_clock::time_point::max()) {
    prepared->deadline = prepared->arrival + (deadline - std::chrono::system_clock::now());
  }
  return prepared;
}

absl::StatusOr<GenerationRequest> GenerationService::AdmitGenerate(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer& request,
    const char* method) const {
  const auto& metadata = context->client_metadata();
  const auto sent_id = metadata.find(std::string(kRequestIdHeader));
  std::string request_id = AcceptOrMakeRequestId(
      sent_id == metadata.end() ? std::nullopt
                                : std::optional<std::string_view>(std::string_view(
                                      sent_id->second.data(), sent_id->second.size())));
  context->AddInitialMetadata(std::string(kRequestIdHeader), request_id);
  absl::StatusOr<GenerationRequest> prepared;
  if (grpc::Status status = Admit(context); !status.ok()) {
    prepared =
        absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
  } else {
    prepared = Prepare(context, request);
  }
  if (!prepared.ok()) {
    AccessRecord record;
    record.request_id = std::move(request_id);
    record.protocol = "grpc";
    record.method = method;
    record.peer = context->peer();
    record.status = prepared.status().code();
    FinishRejected(record);
    return prepared.status();
  }
  prepared->origin = {.request_id = std::move(request_id), .protocol = "grpc"};
  return prepared;
}

grpc::ServerUnaryReactor* GenerationService::Generate(grpc::CallbackServerContext* context,
                                                      const grpc::ByteBuffer* request,
                                                      grpc::ByteBuffer* response) {
  auto prepared = AdmitGenerate(context, *request, "Generate");
  if (!prepared.ok()) return FinishNow(context, ToGrpcStatus(prepared.status()));
  return StartUnaryGenerate(this, context, std::move(*prepared), response);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* GenerationService::GenerateStream(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  auto prepared = AdmitGenerate(context, *request, "GenerateStream");
  if (!prepared.ok()) return new FailedStream(ToGrpcStatus(prepared.status()));
  return StartStreamingGenerate(this, context, std::move(*prepared));
}

grpc::ServerUnaryReactor* GenerationService::Tokenize(grpc::CallbackServerContext* context,
                                                      const grpc::ByteBuffer* request_buffer,
                                                      grpc::ByteBuffer* response_buffer) {
  if (grpc::Status status = Admit(context); !status.ok()) return FinishNow(context, status);
  v1::TokenizeRequest request;
  if (absl::Status status = ParseMessage(*request_buffer, &request); !status.ok()) {
    return FinishNow(context, ToGrpcStatus(status));
  }
  auto ids = options_.tokenizer->Encode(request.text());
  if (!ids.ok()) return FinishNow(context, ToGrpcStatus(ids.status()));
  v1::TokenizeResponse response;
  response.mutable_token_ids()->Add(ids->begin(), ids->end());
  *response_buffer = SerializeMessage(response);
  return FinishNow(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* GenerationService::GetModelInfo(grpc::CallbackServerContext* context,
                                                          const v1::GetModelInfoRequest*,
                                                          v1::ModelInfo* response) {
  if (grpc::Status status = Admit(context); !status.ok()) return FinishNow(context, status);
  FillModelInfo(*options_.config, options_.dispatch, options_.device, options_.engine->Snapshot(),
                response);
  return FinishNow(context, grpc::Status::OK);
}

}  // namespace switchserve
