// The attention and feed-forward layers of the CUDA backend as launch
// sequences (docs/design.md, "The math"; kernels/cpu/cpu_attention.cc and
// cpu_ffn.cc compute the same on the CPU). Every routed module routes on the
// device (route_topk.h), dispatches under capacity (dispatch_plan.h), runs
// its experts over their slots only (linear.h, grouped) and combines the
// kept outputs per token in rank order (step_ops.h).
#include <algorithm>
#include <cmath>

#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_backend_impl.h"
#include "kernels/cuda/dispatch_plan.h"
#include "kernels/cuda/linear.h"

namespace switchserve::cuda {
namespace {

// A router matrix of `n` columns, held transposed (device_weights.h).
LinearWeights Routers(const float* w, int64_t n) {
  return LinearWeights{w, WeightType::kF32, WeightLayout::kKN, n, 0};
}

Activation ToActivation(::switchserve::Activation act) {
  switch (act) {
    case ::switchserve::Activation::kRelu:
      return Activation::kRelu;
    case ::switchserve::Activation::kGelu:
      return Activation::kGelu;
    case ::switchserve::Activation::kSilu:
      return Activation::kSilu;
  }
  return Activation::kNone;
}

LinearEpilogue Scaled(float alpha) {
  LinearEpilogue e;
  e.alpha = alpha;
  return e;
}

}  // namespace

int CudaBackend::MaxExpertRows(int top_k, int n_experts) const {
  const int T = io_->shape().tokens;
  // A router sends each token to an expert at most once.
  if (dispatch_.Dropless() || options_.forced_routing != nullptr) return T;
  const int64_t capacity = dispatch_.SlotsPerExpert(io_->real_tokens(), top_k, n_experts);
  if (dispatch_.scope == CapacityScope::kSequence) {
    // Up to C per group a segment lies in.
    return static_cast<int>(std::min<int64_t>(T, io_->MaxSequenceScopeRows(capacity)));
  }
  return static_cast<int>(std::min<int64_t>(T, capacity));
}

GroupedRows CudaBackend::DispatchedRows(int top_k, int n_experts, int heads,
                                        bool shared_router) const {
  return GroupedRows{.offsets = ws_.offsets.as<int32_t>(),
                     .a_rows = ws_.slot_token.as<int32_t>(),
                     .slot_stride = static_cast<int64_t>(io_->shape().tokens) * top_k,
                     .max_rows = MaxExpertRows(top_k, n_experts),
                     .n_experts = n_experts,
                     .heads = heads,
                     .shared_router = shared_router};
}

Assignments CudaBackend::KeptAssignments(int router_index, int top_k) const {
  return Assignments{.gate = io_->results().trace_gate + io_->trace_offset(router_index),
                     .slot = ws_.assign_slot.as<int32_t>(),
                     .router_stride = static_cast<int64_t>(io_->shape().tokens) * top_k,
                     .top_k = top_k};
}

CombineArgs CudaBackend::KeptCombine(const Assignments& kept, const float* prod, int width,
                                     float* out, int64_t out_ld) const {
  return CombineArgs{.assignments = kept,
                     .tokens = io_->shape().tokens,
                     .prod = prod,
                     .prod_ld = width,
                     .slot_stride = kept.router_stride,
                     .width = width,
                     .out = out,
                     .out_ld = out_ld};
}

absl::Status CudaBackend::Route(const float* logits, int64_t ld, int routers, int n_experts,
                                int top_k, GateType gate, bool renormalize, int router_index) {
  const int T = io_->shape().tokens;
  int32_t* expert = ws_.route_expert.as<int32_t>();
  float* weight = ws_.route_weight.as<float>();
  float* prob = ws_.route_prob.as<float>();
  SWITCHSERVE_CUDA_RETURN_IF_ERROR(
      LaunchRouteTopK(logits, ld, T, n_experts, top_k, gate, renormalize, expert, weight, prob,
                      stream_, routers, n_experts),
      "router top-k");
  const bool dropless = dispatch_.Dropless();
  DispatchPlanInput in;
  in.expert = expert;
  in.weight = weight;
  in.score = logits;
  in.score_ld = ld;
  in.prob = prob;
  in.tokens = T;
  in.top_k = top_k;
  in.n_experts = n_experts;
  in.capacity = dropless ? 0 : dispatch_.SlotsPerExpert(io_->real_tokens(), top_k, n_experts);
  in.mode = options_.forced_routing != nullptr               ? DispatchMode::kForced
            : dropless                                       ? DispatchMode::kDropless
            : dispatch_.overflow == OverflowPolicy::kReroute ? DispatchMode::kReroute
                                                             : DispatchMode::kDrop;
  in.routers = routers;
  in.score_router_offset = n_experts;
  in.counted_tokens = io_->device().counted_tokens;
  const DeviceStep& step = io_->device();
  const DeviceResults& r = io_->results();
  SequenceScope sequence;
  if (step.dispatch_first != nullptr) {
    // Sequence scope: each sequence against its own groups' loads, carried
    // in RouterLayout::ExpertOffset columns (none when dropless).
    sequence.segment_first = step.dispatch_first;
    sequence.segment_count = step.dispatch_count;
    sequence.segments = io_->shape().dispatch_segments;
    sequence.group_size = dispatch_.capacity_group;
    sequence.positions = step.positions;
    sequence.token_sequence = step.token_sequence;
    sequence.carried = step.carried_loads;
    sequence.carried_out = r.carried_out;
    sequence.stride = layout_.total_experts();
    sequence.column = layout_.ExpertOffset(router_index);
    sequence.scratch_loads = ws_.dispatch_loads.as<int32_t>();
    sequence.scratch_taken = ws_.dispatch_taken.as<uint8_t>();
    in.sequence = &sequence;
  }
  DispatchPlanOutput out;
  out.trace_expert = r.trace_expert + io_->trace_offset(router_index);
  out.trace_gate = r.trace_gate + io_->trace_offset(router_index);
  out.trace_fate = r.trace_fate + io_->trace_offset(router_index);
  out.offsets = ws_.offsets.as<int32_t>();
  out.slot_token = ws_.slot_token.as<int32_t>();
  out.slot_weight = ws_.slot_weight.as<float>();
  out.counts = r.counts + io_->counts_offset(router_index);
  out.prob_sum = r.prob_sum + io_->prob_offset(router_index);
  out.assign_slot = ws_.assign_slot.as<int32_t>();
  return CudaStatus(LaunchDispatchPlan(in, out, stream_), "capacity dispatch");
}

absl::Status CudaBackend::Attention(int layer) {
  const DeviceAttentionWeights& w = weights_->layer(layer).attn;
  const AttentionConfig& attn = config_.attention;
  const DeviceStep& step = io_->device();
  const StepShape& shape = io_->shape();
  const int T = shape.tokens;
  const int d = config_.d_model;
  const int H = attn.n_heads, G = attn.n_kv_heads, dh = attn.head_dim;
  const int E = attn.n_experts, k = attn.top_k, ev = attn.CachedValuesPerKvHead();
  const float* xn = ws_.xn.as<float>();
  float* x = ws_.x.as<float>();
  float* qk = ws_.qk.as<float>();
  float* v = ws_.v.as<float>();
  float* a = ws_.a.as<float>();
  float* logits = ws_.router_logits.as<float>();
  const int64_t qk_ld = static_cast<int64_t>(H + G) * dh;
  const float scale = static_cast<float>(std::pow(static_cast<double>(dh), -0.25));
  const int base = attn.IsRouted() ? layout_.AttentionBase(layer) : 0;
  const GateType gate =
      attn.gate == AttentionGate::kSigmoid ? GateType::kSigmoid : GateType::kSoftmaxTopK;

  SWITCHSERVE_CUDA_RETURN_IF_ERROR(LaunchLinear(xn, d, T, d, w.q.Linear(WeightLayout::kNK, d),
                                                H * dh, Scaled(scale), qk, qk_ld, stream_),
                                   "q projection");
  SWITCHSERVE_CUDA_RETURN_IF_ERROR(
      LaunchLinear(xn, d, T, d, w.k.Linear(WeightLayout::kNK, d), G * dh, Scaled(scale),
                   qk + static_cast<int64_t>(H) * dh, qk_ld, stream_),
      "k projection");

  // Values: [T, G * ev * dh].
  if (!attn.IsRouted()) {
    SWITCHSERVE_CUDA_RETURN_IF_ERROR(LaunchLinear(xn, d, T, d, w.v.Linear(WeightLayout::kNK, d),
                                                  G * dh, LinearEpilogue{}, v, G * dh, stream_),
                                     "v projection");
  } else {
    const int routers = attn.ValueRouterHeads();
    SWITCHSERVE_CUDA_RETURN_IF_ERROR(
        LaunchLinear(xn, d, T, d, Routers(w.sel_v, routers * E), routers * E, LinearEpilogue{},
                     logits, routers * E, stream_),
        "value routers");
    if (absl::Status s = Route(logits, routers * E, routers, E, k, gate, false, base); !s.ok()) {
      return s;
    }
    const Assignments kept = KeptAssignments(base, k);
    if (ev > 1) {
      // Destination routing caches every expert's value.
      for (int ge = 0; ge < G * E; ++ge) {
        SWITCHSERVE_CUDA_RETURN_IF_ERROR(
            LaunchLinear(xn, d, T, d,
                         w.v.At(static_cast<int64_t>(ge) * d * dh).Linear(WeightLayout::kKN, dh),
                         dh, LinearEpilogue{}, v + static_cast<int64_t>(ge) * dh,
                         static_cast<int64_t>(G) * E * dh, stream_),
            "expert values");
      }
      SWITCHSERVE_CUDA_RETURN_IF_ERROR(
          LaunchValueWeights(io_->results().trace_expert + io_->trace_offset(base), kept, T, G, E,
                             attn.shared_router, ws_.value_weights.as<float>(), stream_),
          "value weights");
    } else {
      float* prod = ws_.prod.as<float>();
      SWITCHSERVE_CUDA_RETURN_IF_ERROR(
          LaunchGroupedLinear(xn, d, DispatchedRows(k, E, G, attn.shared_router), d,
                              w.v.Linear(WeightLayout::kKN, dh, static_cast<int64_t>(d) * dh), dh,
                              LinearEpilogue{}, prod, dh, stream_),
          "routed values");
      CombineArgs c = KeptCombine(kept, prod, dh, v, static_cast<int64_t>(G) * dh);
      c.heads = G;
      c.shared_router = attn.shared_router;
      c.per_head = true;
      SWITCHSERVE_CUDA_RETURN_IF_ERROR(LaunchCombine(c, stream_), "value combine");
    }
  }

  // RoPE, then this step's keys and values into the cache.
  RopeAppendArgs rope;
  rope.q = qk;
  rope.q_ld = qk_ld;
  rope.q_heads = H;
  rope.k = qk + static_cast<int64_t>(H) * dh;
  rope.k_ld = qk_ld;
  rope.v = v;
  rope.v_ld = static_cast<int64_t>(G) * ev * dh;
  rope.kv_heads = G;
  rope.v_cols = G * ev * dh;
  rope.head_dim = dh;
  rope.n_rot = attn.RotaryDims();
  rope.cos = rope_cos_.as<float>();
  rope.sin = rope_sin_.as<float>();
  rope.positions = step.positions;
  rope.cache_rows = step.cache_rows;
  rope.tokens = T;
  rope.k_cache = k_cache_[layer].get();
  rope.v_cache = v_cache_[layer].get();
  rope.cache_type = sixteen_bit_ ? CacheType::kBf16 : CacheType::kF32;
  SWITCHSERVE_CUDA_RETURN_IF_ERROR(LaunchRopeAppend(rope, stream_), "rope + cache append");

  AttentionArgs args;
  args.shape.heads = H;
  args.shape.kv_heads = G;
  args.shape.head_dim = dh;
  args.shape.values_per_kv_head = ev;
  args.shape.block_size = block_size_;
  args.shape.segment_tokens = segment_tokens_;
  args.shape.cache_type = rope.cache_type;
  args.query_tile = query_tile_;
  args.q = qk;
  args.q_ld = qk_ld;
  args.k_cache = rope.k_cache;
  args.v_cache = rope.v_cache;
  args.value_weights = ev > 1 ? ws_.value_weights.as<float>() : nullptr;
  if (attn.IsXl()) {
    args.xl_keys = xl_keys_[layer].as<float>();
    args.xl_positions = table_positions_;
  }
  args.positions = step.positions;
  args.token_sequence = step.token_sequence;
  args.block_tables = step.block_tables;
  args.block_offsets = step.block_offsets;
  args.tokens = T;
  args.tile_first = step.tile_first;
  args.tile_count = step.tile_count;
  args.tiles = shape.tiles;
  args.segments = shape.segments;
  args.max_segments = shape.max_segments;
  args.partials = ws_.partials.as<float>();
  args.out = a;
  args.out_ld = static_cast<int64_t>(H) * dh;
  SWITCHSERVE_CUDA_RETURN_IF_ERROR(LaunchAttention(args, stream_), "attention");

  // Output projection, added to the residual stream.
  if (!attn.IsRouted()) {
    if (attn.kind == AttentionKind::kSwitchHead) {
      // E = 1: a per-head output gate sigmoid(sel_o x)_h scales a_h.
      SWITCHSERVE_CUDA_RETURN_IF_ERROR(
          LaunchLinear(xn, d, T, d, Routers(w.sel_o, H), H, LinearEpilogue{}, logits, H, stream_),
          "output gates");
      SWITCHSERVE_CUDA_RETURN_IF_ERROR(LaunchHeadGate(logits, T, H, dh, a, stream_), "output gate");
    }
    LinearEpilogue add;
    add.accumulate = true;
    SWITCHSERVE_CUDA_RETURN_IF_ERROR(
        LaunchLinear(a, static_cast<int64_t>(H) * dh, T, H * dh,
                     w.o.Linear(WeightLayout::kNK, static_cast<int64_t>(H) * dh), d, add, x, d,
                     stream_),
        "o projection");
    return absl::OkStatus();
  }
  const int routers = attn.OutputRouterHeads();
  const int base_o = base + attn.ValueRouterHeads();
  SWITCHSERVE_CUDA_RETURN_IF_ERROR(
      LaunchLinear(xn, d, T, d, Routers(w.sel_o, routers * E), routers * E, LinearEpilogue{},
                   logits, routers * E, stream_),
      "output routers");
  if (absl::Status s = Route(logits, routers * E, routers, E, k, gate, false, base_o); !s.ok()) {
    return s;
  }
  GroupedRows rows = DispatchedRows(k, E, H, attn.shared_router);
  rows.a_head_cols = dh;
  float* prod = ws_.prod.as<float>();
  SWITCHSERVE_CUDA_RETURN_IF_ERROR(
      LaunchGroupedLinear(a, static_cast<int64_t>(H) * dh, rows, dh,
                          w.o.Linear(WeightLayout::kKN, d, static_cast<int64_t>(dh) * d), d,
                          LinearEpilogue{}, prod, d, stream_),
      "routed outputs");
  CombineArgs c = KeptCombine(KeptAssignments(base_o, k), prod, d, x, d);
  c.heads = H;
  c.shared_router = attn.shared_router;
  c.accumulate = true;
  return CudaStatus(LaunchCombine(c, stream_), "output combine");
}

absl::Status CudaBackend::Ffn(int layer) {
  const DeviceFfnWeights& w = weights_->layer(layer).ffn;
  const FfnConfig& ffn = config_.ffn;
  const int T = io_->shape().tokens;
  const int d = config_.d_model, F = ffn.d_ff;
  const float* xn = ws_.xn.as<float>();
  float* x = ws_.x.as<float>();
  float* hidden = ws_.hidden.as<float>();
  LinearEpilogue up;
  up.bias = w.b1;
  up.bias_stride = F;
  up.activation = ToActivation(ffn.activation);
  LinearEpilogue down;
  down.bias = w.b2;
  down.bias_stride = d;
  if (ffn.kind == FfnKind::kDense) {
    down.accumulate = true;
    SWITCHSERVE_CUDA_RETURN_IF_ERROR(
        LaunchLinear(xn, d, T, d, w.w1.Linear(WeightLayout::kNK, d), F, up, hidden, F, stream_),
        "ffn up");
    return CudaStatus(
        LaunchLinear(hidden, F, T, F, w.w2.Linear(WeightLayout::kNK, F), d, down, x, d, stream_),
        "ffn down");
  }
  const int X = ffn.n_experts, k = ffn.top_k;
  float* logits = ws_.router_logits.as<float>();
  LinearEpilogue router;
  router.bias = w.router_b;
  SWITCHSERVE_CUDA_RETURN_IF_ERROR(
      LaunchLinear(xn, d, T, d, Routers(w.router_w, X), X, router, logits, X, stream_),
      "ffn router");
  const GateType gate = ffn.gate == FfnGate::kSoftmax ? GateType::kSoftmax : GateType::kSigmoid;
  const int index = layout_.FfnRouter(layer);
  if (absl::Status s = Route(logits, X, 1, X, k, gate, ffn.renormalize, index); !s.ok()) return s;
  GroupedRows rows = DispatchedRows(k, X, 1, false);
  SWITCHSERVE_CUDA_RETURN_IF_ERROR(
      LaunchGroupedLinear(xn, d, rows, d,
                          w.w1.Linear(WeightLayout::kNK, d, static_cast<int64_t>(F) * d), F, up,
                          hidden, F, stream_),
      "expert up");
  rows.a_rows = nullptr;  // hidden rows are in slot order
  float* prod = ws_.prod.as<float>();
  SWITCHSERVE_CUDA_RETURN_IF_ERROR(
      LaunchGroupedLinear(hidden, F, rows, F,
                          w.w2.Linear(WeightLayout::kNK, F, static_cast<int64_t>(d) * F), d, down,
                          prod, d, stream_),
      "expert down");
  CombineArgs c = KeptCombine(KeptAssignments(index, k), prod, d, x, d);
  c.accumulate = true;
  return CudaStatus(LaunchCombine(c, stream_), "ffn combine");
}

}  // namespace switchserve::cuda
