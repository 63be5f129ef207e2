// ExpectedTensors and ValidateWeights: the tensor table of
// docs/model-format.md, for one config.
#include <limits>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/model/model_loader.h"

namespace switchserve {
namespace {

using Selector = Tensor& (*)(ModelWeights&, int);

// Every Tensor slot of ModelWeights, named after its field, so that a filled
// slot the config does not call for can be reported.
struct Slot {
  const char* field;
  bool per_layer;
  Selector select;
};

#define SWITCHSERVE_MODEL_SLOT(field)                                       \
  {                                                                         \
#field, false, [](ModelWeights & w, int) -> Tensor& { return w.field; } \
  }
#define SWITCHSERVE_LAYER_SLOT(field)                                                  \
  {                                                                                    \
#field, true, [](ModelWeights & w, int i) -> Tensor& { return w.layers[i].field; } \
  }

const Slot kSlots[] = {
    SWITCHSERVE_MODEL_SLOT(embedding),    SWITCHSERVE_MODEL_SLOT(lm_head),
    SWITCHSERVE_MODEL_SLOT(lm_head_bias), SWITCHSERVE_MODEL_SLOT(final_norm_w),
    SWITCHSERVE_MODEL_SLOT(final_norm_b), SWITCHSERVE_LAYER_SLOT(attn_norm_w),
    SWITCHSERVE_LAYER_SLOT(attn_norm_b),  SWITCHSERVE_LAYER_SLOT(attn.q),
    SWITCHSERVE_LAYER_SLOT(attn.k),       SWITCHSERVE_LAYER_SLOT(attn.v),
    SWITCHSERVE_LAYER_SLOT(attn.o),       SWITCHSERVE_LAYER_SLOT(attn.sel_v),
    SWITCHSERVE_LAYER_SLOT(attn.sel_o),   SWITCHSERVE_LAYER_SLOT(attn.pos_to_pk),
    SWITCHSERVE_LAYER_SLOT(ffn_norm_w),   SWITCHSERVE_LAYER_SLOT(ffn_norm_b),
    SWITCHSERVE_LAYER_SLOT(ffn.router_w), SWITCHSERVE_LAYER_SLOT(ffn.router_b),
    SWITCHSERVE_LAYER_SLOT(ffn.w1),       SWITCHSERVE_LAYER_SLOT(ffn.b1),
    SWITCHSERVE_LAYER_SLOT(ffn.w2),       SWITCHSERVE_LAYER_SLOT(ffn.b2),
};

#undef SWITCHSERVE_MODEL_SLOT
#undef SWITCHSERVE_LAYER_SLOT

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace

int64_t ExpectedTensor::numel() const {
  int64_t n = 1;
  for (int64_t dim : shape) {
    // Saturate rather than overflow (only absurd configs get near this).
    if (__builtin_mul_overflow(n, dim, &n)) return std::numeric_limits<int64_t>::max();
  }
  return n;
}

std::vector<ExpectedTensor> ExpectedTensors(const ModelConfig& config) {
  std::vector<ExpectedTensor> out;
  auto add = [&out](std::string name, std::vector<int64_t> shape, int layer, Selector select) {
    // Norms, biases, router weights and the XL position projection (read
    // once, to tabulate the position keys) are held in f32
    // (ExpectedTensor::held_in_f32).
    const bool f32 = shape.size() == 1 || name.ends_with(".b1") || name.ends_with(".b2") ||
                     name.ends_with("sel_v") || name.ends_with("sel_o") ||
                     name.ends_with("router.weight") || name.ends_with("pos_to_pk");
    out.push_back({std::move(name), std::move(shape), layer, select, f32});
  };
  const int64_t d = config.d_model;
  const int64_t V = config.vocab_size;
  const bool layernorm = config.norm == NormKind::kLayerNorm;

  add("embedding.weight", {V, d}, -1, [](ModelWeights& w, int) -> Tensor& { return w.embedding; });
  if (!config.tie_embeddings) {
    add("lm_head.weight", {V, d}, -1, [](ModelWeights& w, int) -> Tensor& { return w.lm_head; });
  }
  if (config.output_bias) {
    add("lm_head.bias", {V}, -1, [](ModelWeights& w, int) -> Tensor& { return w.lm_head_bias; });
  }
  add("final_norm.weight", {d}, -1, [](ModelWeights& w, int) -> Tensor& { return w.final_norm_w; });
  if (layernorm) {
    add("final_norm.bias", {d}, -1, [](ModelWeights& w, int) -> Tensor& { return w.final_norm_b; });
  }

  const AttentionConfig& a = config.attention;
  const int64_t H = a.n_heads, G = a.n_kv_heads, dh = a.head_dim, E = a.n_experts;
  const FfnConfig& f = config.ffn;
  const int64_t F = f.d_ff, X = f.n_experts;
  for (int i = 0; i < config.n_layers; ++i) {
    const std::string p = absl::StrCat("layers.", i, ".");
    add(p + "attn_norm.weight", {d}, i,
        [](ModelWeights& w, int l) -> Tensor& { return w.layers[l].attn_norm_w; });
    if (layernorm) {
      add(p + "attn_norm.bias", {d}, i,
          [](ModelWeights& w, int l) -> Tensor& { return w.layers[l].attn_norm_b; });
    }
    add(p + "attn.q.weight", {H * dh, d}, i,
        [](ModelWeights& w, int l) -> Tensor& { return w.layers[l].attn.q; });
    add(p + "attn.k.weight", {G * dh, d}, i,
        [](ModelWeights& w, int l) -> Tensor& { return w.layers[l].attn.k; });
    const Selector v = [](ModelWeights& w, int l) -> Tensor& { return w.layers[l].attn.v; };
    const Selector o = [](ModelWeights& w, int l) -> Tensor& { return w.layers[l].attn.o; };
    const Selector sel_v = [](ModelWeights& w, int l) -> Tensor& { return w.layers[l].attn.sel_v; };
    const Selector sel_o = [](ModelWeights& w, int l) -> Tensor& { return w.layers[l].attn.sel_o; };
    if (a.kind == AttentionKind::kDense) {
      add(p + "attn.v.weight", {G * dh, d}, i, v);
      add(p + "attn.o.weight", {d, H * dh}, i, o);
    } else if (a.IsRouted()) {
      add(p + "attn.v", {G * E, d, dh}, i, v);
      add(p + "attn.o", {H * E, dh, d}, i, o);
      add(p + "attn.sel_v", {a.shared_router ? E : G * E, d}, i, sel_v);
      add(p + "attn.sel_o", {a.shared_router ? E : H * E, d}, i, sel_o);
    } else {  // SwitchHead with one expert: dense V/O and a per-head output gate
      add(p + "attn.v", {G * dh, d}, i, v);
      add(p + "attn.o", {d, H * dh}, i, o);
      add(p + "attn.sel_o", {H, d}, i, sel_o);
    }
    if (a.IsXl()) {
      add(p + "attn.pos_to_pk", {H * dh, d}, i,
          [](ModelWeights& w, int l) -> Tensor& { return w.layers[l].attn.pos_to_pk; });
    }
    add(p + "ffn_norm.weight", {d}, i,
        [](ModelWeights& w, int l) -> Tensor& { return w.layers[l].ffn_norm_w; });
    if (layernorm) {
      add(p + "ffn_norm.bias", {d}, i,
          [](ModelWeights& w, int l) -> Tensor& { return w.layers[l].ffn_norm_b; });
    }
    const Selector w1 = [](ModelWeights& w, int l) -> Tensor& { return w.layers[l].ffn.w1; };
    const Selector b1 = [](ModelWeights& w, int l) -> Tensor& { return w.layers[l].ffn.b1; };
    const Selector w2 = [](ModelWeights& w, int l) -> Tensor& { return w.layers[l].ffn.w2; };
    const Selector b2 = [](ModelWeights& w, int l) -> Tensor& { return w.layers[l].ffn.b2; };
    if (f.kind == FfnKind::kDense) {
      add(p + "ffn.w1.weight", {F, d}, i, w1);
      if (f.bias) add(p + "ffn.w1.bias", {F}, i, b1);
      add(p + "ffn.w2.weight", {d, F}, i, w2);
      if (f.bias) add(p + "ffn.w2.bias", {d}, i, b2);
    } else {
      add(p + "ffn.router.weight", {X, d}, i,
          [](ModelWeights& w, int l) -> Tensor& { return w.layers[l].ffn.router_w; });
      if (f.router_bias) {
        add(p + "ffn.router.bias", {X}, i,
            [](ModelWeights& w, int l) -> Tensor& { return w.layers[l].ffn.router_b; });
      }
      add(p + "ffn.w1", {X, F, d}, i, w1);
      if (f.bias) add(p + "ffn.b1", {X, F}, i, b1);
      add(p + "ffn.w2", {X, d, F}, i, w2);
      if (f.bias) add(p + "ffn.b2", {X, d}, i, b2);
    }
  }
  return out;
}

absl::Status ValidateWeights(const ModelConfig& config, const ModelWeights& weights) {
  if (static_cast<int64_t>(weights.layers.size()) != config.n_layers) {
    return absl::InvalidArgumentError(absl::StrCat("weights: expected ", config.n_layers,
                                                   " layers (n_layers), found ",
                                                   weights.layers.size()));
  }
  std::set<const Tensor*> expected;
  for (const ExpectedTensor& e : ExpectedTensors(config)) {
    const Tensor& t = e.In(weights);
    expected.insert(&t);
    if (t.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("weights: missing tensor ", e.name,
                                                     " (expected shape ", ShapeText(e.shape), ")"));
    }
    if (t.shape() != e.shape) {
      return absl::InvalidArgumentError(absl::StrCat("weights: tensor ", e.name,
                                                     ": expected shape ", ShapeText(e.shape),
                                                     ", found ", ShapeText(t.shape())));
    }
    if (t.size() != e.numel()) {
      return absl::InvalidArgumentError(absl::StrCat("weights: tensor ", e.name, ": shape ",
                                                     ShapeText(e.shape), " needs ", e.numel(),
                                                     " values, found ", t.size()));
    }
    if (e.held_in_f32 && t.dtype() != DType::kF32) {
      return absl::InvalidArgumentError(absl::StrCat(
          "weights: tensor ", e.name, ": expected F32 (",
          "norms, biases and routers are held in f32), found ", std::string(ToString(t.dtype()))));
    }
    if (t.dtype() != DType::kF32 && t.dtype() != DType::kBF16 && t.dtype() != DType::kF16) {
      return absl::InvalidArgumentError(absl::StrCat("weights: tensor ", e.name,
                                                     ": expected F32, BF16 or F16, found ",
                                                     std::string(ToString(t.dtype()))));
    }
  }
  ModelWeights& mutable_weights = const_cast<ModelWeights&>(weights);  // selectors are non-const
  for (const Slot& slot : kSlots) {
    const int layers = slot.per_layer ? config.n_layers : 1;
    for (int i = 0; i < layers; ++i) {
      const Tensor& t = slot.select(mutable_weights, i);
      if (expected.count(&t) == 0 && !t.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "weights: unexpected tensor ", slot.per_layer ? absl::StrCat("layers.", i, ".") : "",
            slot.field, " (shape ", ShapeText(t.shape()), "): the config does not call for it"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace switchserve
