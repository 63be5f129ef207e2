#include "server/proto_convert.h"

#include "engine/text/detokenizer.h"

namespace switchserve {
namespace {

const char* FateName(RouteFate fate) {
  switch (fate) {
    case RouteFate::kKept:
      return "kept";
    case RouteFate::kRerouted:
      return "rerouted";
    case RouteFate::kDropped:
      return "dropped";
  }
  return "kept";
}

std::string TokenText(const Tokenizer* tokenizer, int32_t id) {
  std::string text;
  AppendSanitizedUtf8(tokenizer->PieceBytes(id), true, &text);
  return text;
}

void FillRouting(const TokenRouting& routing, const RouterLayout& layout, v1::TokenRouting* out) {
  for (size_t r = 0; r < layout.size(); ++r) {
    const RouterId& router = layout[r];
    v1::RouterChoice* choice = out->add_routers();
    choice->set_layer(router.layer);
    choice->set_module(std::string(ToString(router.module)));
    choice->set_head(router.head);
    const size_t first = layout.ChoiceOffset(static_cast<int>(r));
    for (size_t next = first; next < first + router.top_k && next < routing.choices.size();
         ++next) {
      const RouteChoice& c = routing.choices[next];
      v1::ExpertChoice* expert = choice->add_experts();
      expert->set_expert(c.expert);
      expert->set_gate(c.gate);
      expert->set_fate(FateName(c.fate));
    }
  }
}

template <typename Response>
void SetStopReasonOf(const GenerationUpdate& final_update, Response* response) {
  if (final_update.finish_reason != FinishReason::kStop) return;
  if (final_update.stop_token_id >= 0) {
    response->set_stop_token_id(final_update.stop_token_id);
  } else {
    response->set_stop_string(final_update.stop_string);
  }
}

}  // namespace

void SetStopReason(const GenerationUpdate& final_update, v1::GenerateResponse* response) {
  SetStopReasonOf(final_update, response);
}

void SetStopReason(const GenerationUpdate& final_update, v1::GenerateStreamResponse* response) {
  SetStopReasonOf(final_update, response);
}

v1::FinishReason ToProto(FinishReason reason) {
  switch (reason) {
    case FinishReason::kLength:
      return v1::FINISH_REASON_LENGTH;
    case FinishReason::kStop:
      return v1::FINISH_REASON_STOP;
    case FinishReason::kEos:
      return v1::FINISH_REASON_EOS;
    case FinishReason::kCancelled:
      return v1::FINISH_REASON_CANCELLED;
    case FinishReason::kNone:
      break;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl and gRPC share the canonical code numbering.
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

namespace {

// A token's logprob and its alternatives, with their texts.
void FillLogprobs(const GeneratedTokenInfo& info, const TokenDescriber& describer,
                  v1::GeneratedToken* token) {
  token->set_logprob(info.logprob);
  for (const auto& [id, logprob] : info.top_logprobs) {
    v1::TokenLogprob* alt = token->add_top_logprobs();
    alt->set_token_id(id);
    alt->set_logprob(logprob);
    alt->set_text(TokenText(describer.tokenizer, id));
  }
}

}  // namespace

void AppendPromptTokens(const GenerationUpdate& update, const TokenDescriber& describer,
                        google::protobuf::RepeatedPtrField<v1::GeneratedToken>* tokens) {
  for (const GeneratedTokenInfo& info : update.prompt_logprobs) {
    v1::GeneratedToken* token = tokens->Add();
    token->set_token_id(info.token_id);
    token->set_rank(info.rank);
    FillLogprobs(info, describer, token);
  }
}

void AppendTokens(const GenerationUpdate& update, const SamplingParams& params,
                  const TokenDescriber& describer,
                  google::protobuf::RepeatedField<int32_t>* token_ids,
                  google::protobuf::RepeatedPtrField<v1::GeneratedToken>* tokens) {
  const bool detail = params.logprobs > 0 || params.return_routing;
  for (const GeneratedTokenInfo& info : update.tokens) {
    token_ids->Add(info.token_id);
    if (!detail) continue;
    v1::GeneratedToken* token = tokens->Add();
    token->set_token_id(info.token_id);
    if (params.logprobs > 0) FillLogprobs(info, describer, token);
    if (params.return_routing)
      FillRouting(info.routing, describer.layout, token->mutable_routing());
  }
}

void FillUsageAndTiming(const GenerationUpdate& final_update, v1::Usage* usage,
                        v1::Timing* timing) {
  usage->set_prompt_tokens(final_update.prompt_tokens);
  usage->set_completion_tokens(final_update.completion_tokens);
  usage->set_cached_prompt_tokens(final_update.cached_prompt_tokens);
  timing->set_queue_ms(final_update.queue_ms);
  timing->set_time_to_first_token_ms(final_update.time_to_first_token_ms);
  timing->set_total_ms(final_update.total_ms);
}

std::string ArchitectureName(const ModelConfig& config) {
  const bool routed_attention = config.attention.IsRouted();
  const bool moe_ffn = config.ffn.kind == FfnKind::kMoe;
  if (routed_attention && moe_ffn) return "switchall";
  if (routed_attention) return "switchhead";
  if (moe_ffn) return "switch";
  return "dense";
}

void FillModelInfo(const ModelConfig& config, const std::string& name,
                   const DispatchConfig& dispatch, const std::string& device,
                   const EngineSnapshot& snapshot, v1::ModelInfo* info) {
  info->set_name(name);
  info->set_architecture(ArchitectureName(config));
  info->set_vocab_size(config.vocab_size);
  info->set_d_model(config.d_model);
  info->set_n_layers(config.n_layers);
  info->set_context_length(config.max_seq_len);
  info->set_tokenizer(config.tokenizer == TokenizerKind::kByte ? "byte" : "sentencepiece");
  info->set_bos_token_id(config.bos_token_id.value_or(-1));
  info->set_eos_token_id(config.eos_token_id.value_or(-1));
  v1::AttentionInfo* attention = info->mutable_attention();
  attention->set_type(config.attention.kind == AttentionKind::kSwitchHead ? "switchhead" : "dense");
  attention->set_n_heads(config.attention.n_heads);
  attention->set_n_kv_heads(config.attention.n_kv_heads);
  attention->set_head_dim(config.attention.head_dim);
  attention->set_n_experts(config.attention.n_experts);
  attention->set_top_k(config.attention.top_k);
  attention->set_position(ConfigName(config.attention.position));
  attention->set_gate(ConfigName(config.attention.gate));
  attention->set_value_routing(ConfigName(config.attention.value_routing));
  attention->set_shared_router(config.attention.shared_router);
  v1::FfnInfo* ffn = info->mutable_ffn();
  ffn->set_type(config.ffn.kind == FfnKind::kMoe ? "moe" : "dense");
  ffn->set_d_ff(config.ffn.d_ff);
  ffn->set_n_experts(config.ffn.n_experts);
  ffn->set_top_k(config.ffn.top_k);
  ffn->set_gate(ConfigName(config.ffn.gate));
  ffn->set_activation(ConfigName(config.ffn.activation));
  v1::DispatchInfo* d = info->mutable_dispatch();
  d->set_capacity_factor(dispatch.capacity_factor);
  d->set_min_capacity(dispatch.min_capacity);
  d->set_overflow(std::string(ToString(dispatch.overflow)));
  d->set_capacity_scope(std::string(ToString(dispatch.scope)));
  d->set_capacity_group(dispatch.scope == CapacityScope::kSequence ? dispatch.capacity_group : 0);
  v1::CacheInfo* cache = info->mutable_cache();
  cache->set_block_size(snapshot.block_size);
  cache->set_total_blocks(snapshot.total_blocks);
  cache->set_used_blocks(snapshot.used_blocks);
  cache->set_capacity_tokens(snapshot.total_blocks * snapshot.block_size);
  cache->set_running_requests(snapshot.running);
  cache->set_waiting_requests(snapshot.waiting);
  cache->set_prefix_caching(snapshot.prefix_caching);
  cache->set_cached_blocks(snapshot.cached_blocks);
  info->set_device(device);
}

}  // namespace switchserve
