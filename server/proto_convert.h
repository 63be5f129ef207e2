// Conversions between the engine's plain structs and the switchserve.v1
// messages. Pure functions; safe from any thread.
#ifndef SWITCHSERVE_SERVER_PROTO_CONVERT_H_
#define SWITCHSERVE_SERVER_PROTO_CONVERT_H_

#include <string>
#include <vector>

#include "engine/model/model_config.h"
#include "engine/moe/router_layout.h"
#include "engine/moe/routing_stats.h"
#include "engine/runtime/generation_engine.h"
#include "engine/runtime/request.h"
#include "engine/text/tokenizer.h"
#include "grpcpp/support/status.h"
#include "switchserve/v1/generation.pb.h"

namespace switchserve {

// What a response needs to describe tokens: names of routers, token texts.
struct TokenDescriber {
  const Tokenizer* tokenizer = nullptr;
  RouterLayout layout;  // the model's routers
};

v1::FinishReason ToProto(FinishReason reason);
grpc::Status ToGrpcStatus(const absl::Status& status);

// Appends the update's ids (and, when asked for, their detail) to a response.
void AppendTokens(const GenerationUpdate& update, const SamplingParams& params,
                  const TokenDescriber& describer,
                  google::protobuf::RepeatedField<int32_t>* token_ids,
                  google::protobuf::RepeatedPtrField<v1::GeneratedToken>* tokens);
// Appends the update's prompt tokens with their logprobs
// (SamplingParams::prompt_logprobs) to a response.
void AppendPromptTokens(const GenerationUpdate& update, const TokenDescriber& describer,
                        google::protobuf::RepeatedPtrField<v1::GeneratedToken>* tokens);
void FillUsageAndTiming(const GenerationUpdate& final_update, v1::Usage* usage, v1::Timing* timing);
// What stopped a request that a stop string or stop token ended (the
// response's stop_reason); nothing for other ends.
void SetStopReason(const GenerationUpdate& final_update, v1::GenerateResponse* response);
void SetStopReason(const GenerationUpdate& final_update, v1::GenerateStreamResponse* response);

// "switchall", "switchhead", "switch" or "dense".
std::string ArchitectureName(const ModelConfig& config);
// `name` is the served model name (GenerationServiceOptions::model_name).
void FillModelInfo(const ModelConfig& config, const std::string& name,
                   const DispatchConfig& dispatch, const std::string& device,
                   const EngineSnapshot& snapshot, v1::ModelInfo* info);

}  // namespace switchserve

#endif  // SWITCHSERVE_SERVER_PROTO_CONVERT_H_
