#include "tests/util/naive_reference.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/model/model_loader.h"
#include "gtest/gtest.h"

namespace switchserve::testing {
namespace {

using Vec = std::vector<double>;

Vec Norm(const ModelConfig& c, const Vec& x, const Tensor& w, const Tensor& b) {
  const int d = c.d_model;
  double mean = 0, var = 0;
  if (c.norm == NormKind::kLayerNorm) {
    for (double v : x) mean += v;
    mean /= d;
  }
  for (double v : x) var += (v - mean) * (v - mean);
  var /= d;
  Vec out(d);
  for (int i = 0; i < d; ++i) {
    out[i] =
        (x[i] - mean) / std::sqrt(var + c.norm_eps) * w.f32()[i] + (b.empty() ? 0 : b.f32()[i]);
  }
  return out;
}

// rows x cols matrix at `m` (row-major) times x.
Vec MatVec(const float* m, int rows, int cols, const Vec& x) {
  Vec out(rows, 0.0);
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) out[r] += static_cast<double>(m[r * cols + c]) * x[c];
  }
  return out;
}

// x (length rows) times m [rows, cols].
Vec VecMat(const Vec& x, const float* m, int rows, int cols) {
  Vec out(cols, 0.0);
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) out[c] += x[r] * m[r * cols + c];
  }
  return out;
}

double Sig(double z) { return 1.0 / (1.0 + std::exp(-z)); }

Route TopK(const Vec& z, int k, bool softmax_topk) {
  const int E = static_cast<int>(z.size());
  std::vector<int> order(E);
  for (int e = 0; e < E; ++e) order[e] = e;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return z[a] > z[b]; });
  Route r;
  r.experts.assign(order.begin(), order.begin() + k);
  double sum = 0;
  for (int e : r.experts) sum += std::exp(z[e] - z[r.experts[0]]);
  for (int e : r.experts) {
    r.weights.push_back(softmax_topk ? std::exp(z[e] - z[r.experts[0]]) / sum : Sig(z[e]));
  }
  return r;
}

void Rope(const ModelConfig& c, double* v, int pos) {
  if (c.attention.position == PositionKind::kXl) return;  // no RoPE with XL positions
  const int n_rot = c.attention.RotaryDims(), half = n_rot / 2;
  for (int i = 0; i < half; ++i) {
    const double angle = pos * std::pow(c.attention.rope_base, -2.0 * i / n_rot);
    const double a = v[i], b = v[i + half];
    v[i] = a * std::cos(angle) - b * std::sin(angle);
    v[i + half] = b * std::cos(angle) + a * std::sin(angle);
  }
}

// XL: r_h(p) = pos_to_pk[h*dh : (h+1)*dh] . (dh^-1/4 * pe(p)), pe the
// interleaved sin/cos sinusoid of width d, base 10000; all of head h's keys.
Vec XlPositionKey(const ModelConfig& c, const AttentionWeights& w, int h, int p) {
  const int d = c.d_model, dh = c.attention.head_dim;
  Vec pe(d);
  for (int m = 0; m < d / 2; ++m) {
    const double angle = p * std::pow(10000.0, -2.0 * m / d);
    pe[2 * m] = std::sin(angle) * std::pow(dh, -0.25);
    pe[2 * m + 1] = std::cos(angle) * std::pow(dh, -0.25);
  }
  return MatVec(w.pos_to_pk.f32() + static_cast<int64_t>(h) * dh * d, dh, d, pe);
}

double Act(Activation act, double v) {
  switch (act) {
    case Activation::kRelu:
      return v > 0 ? v : 0;
    case Activation::kGelu:
      return 0.5 * v * (1 + std::erf(v / std::sqrt(2.0)));
    case Activation::kSilu:
      return v * Sig(v);
  }
  return 0;
}

std::vector<Vec> NaiveAttention(const ModelConfig& c, const AttentionWeights& w,
                                const std::vector<Vec>& xs, int layer, const ForcedRoutes* forced) {
  const AttentionConfig& a = c.attention;
  const int T = static_cast<int>(xs.size()), d = c.d_model;
  const int H = a.n_heads, G = a.n_kv_heads, dh = a.head_dim, E = a.n_experts, k = a.top_k;
  const bool routed = a.IsRouted(), softmax_topk = a.gate == AttentionGate::kSoftmaxTopK;
  const bool destination = routed && a.value_routing == ValueRouting::kDestination;
  const double s = std::pow(dh, -0.25);
  std::vector<Vec> q(T), kk(T);
  // values[t][g][e] (e = 0 only unless destination)
  std::vector<std::vector<std::vector<Vec>>> values(T);
  std::vector<std::vector<Route>> vroute(T);  // per token, per KV head
  for (int t = 0; t < T; ++t) {
    q[t] = MatVec(w.q.f32(), H * dh, d, xs[t]);
    kk[t] = MatVec(w.k.f32(), G * dh, d, xs[t]);
    for (double& v : q[t]) v *= s;
    for (double& v : kk[t]) v *= s;
    for (int h = 0; h < H; ++h) Rope(c, q[t].data() + h * dh, t);
    for (int g = 0; g < G; ++g) Rope(c, kk[t].data() + g * dh, t);
    values[t].resize(G);
    vroute[t].resize(G);
    for (int g = 0; g < G; ++g) {
      if (!routed) {
        values[t][g].push_back(MatVec(w.v.f32() + g * dh * d, dh, d, xs[t]));
        continue;
      }
      const int r = a.shared_router ? 0 : g;
      vroute[t][g] = forced != nullptr
                         ? forced->Get(layer, MoeModule::kAttnV, r, t)
                         : TopK(MatVec(w.sel_v.f32() + r * E * d, E, d, xs[t]), k, softmax_topk);
      std::vector<Vec> per_expert(E);
      for (int e = 0; e < E; ++e) {
        per_expert[e] = VecMat(xs[t], w.v.f32() + (g * E + e) * d * dh, d, dh);
      }
      if (destination) {
        values[t][g] = per_expert;
      } else {
        Vec v(dh, 0.0);
        for (size_t i = 0; i < vroute[t][g].experts.size(); ++i) {
          for (int j = 0; j < dh; ++j) {
            v[j] += vroute[t][g].weights[i] * per_expert[vroute[t][g].experts[i]][j];
          }
        }
        values[t][g].push_back(v);
      }
    }
  }
  std::vector<Vec> ys(T, Vec(d, 0.0));
  for (int t = 0; t < T; ++t) {
    std::vector<Vec> heads(H, Vec(dh, 0.0));
    for (int h = 0; h < H; ++h) {
      const int g = h / (H / G);
      Vec p(t + 1);
      double mx = -1e300, sum = 0;
      for (int j = 0; j <= t; ++j) {
        p[j] = 0;
        for (int i = 0; i < dh; ++i) p[j] += q[t][h * dh + i] * kk[j][g * dh + i];
        if (a.IsXl()) {  // + q_t . r_h(j - t)
          const Vec r = XlPositionKey(c, w, h, j - t);
          for (int i = 0; i < dh; ++i) p[j] += q[t][h * dh + i] * r[i];
        }
        mx = std::max(mx, p[j]);
      }
      for (int j = 0; j <= t; ++j) sum += (p[j] = std::exp(p[j] - mx));
      for (int j = 0; j <= t; ++j) {
        if (destination) {
          for (size_t i = 0; i < vroute[t][g].experts.size(); ++i) {
            const double wt = vroute[t][g].weights[i] * p[j] / sum;
            const Vec& v = values[j][g][vroute[t][g].experts[i]];
            for (int x = 0; x < dh; ++x) heads[h][x] += wt * v[x];
          }
        } else {
          for (int x = 0; x < dh; ++x) heads[h][x] += p[j] / sum * values[j][g][0][x];
        }
      }
    }
    if (!routed) {
      Vec cat;
      for (int h = 0; h < H; ++h) {
        const double gate = a.kind == AttentionKind::kSwitchHead
                                ? Sig(MatVec(w.sel_o.f32() + h * d, 1, d, xs[t])[0])
                                : 1.0;
        for (double v : heads[h]) cat.push_back(gate * v);
      }
      ys[t] = MatVec(w.o.f32(), d, H * dh, cat);
      continue;
    }
    for (int h = 0; h < H; ++h) {
      const int r = a.shared_router ? 0 : h;
      const Route route =
          forced != nullptr ? forced->Get(layer, MoeModule::kAttnO, r, t)
                            : TopK(MatVec(w.sel_o.f32() + r * E * d, E, d, xs[t]), k, softmax_topk);
      for (size_t i = 0; i < route.experts.size(); ++i) {
        const Vec y = VecMat(heads[h], w.o.f32() + (h * E + route.experts[i]) * dh * d, dh, d);
        for (int x = 0; x < d; ++x) ys[t][x] += route.weights[i] * y[x];
      }
    }
  }
  return ys;
}

Vec NaiveExpert(const ModelConfig& c, const FfnWeights& w, int e, const Vec& x) {
  const int d = c.d_model, F = c.ffn.d_ff;
  Vec h = MatVec(w.w1.f32() + e * F * d, F, d, x);
  for (int i = 0; i < F; ++i)
    h[i] = Act(c.ffn.activation, h[i] + (w.b1.empty() ? 0 : w.b1.f32()[e * F + i]));
  Vec y = MatVec(w.w2.f32() + e * d * F, d, F, h);
  for (int i = 0; i < d; ++i) y[i] += w.b2.empty() ? 0 : w.b2.f32()[e * d + i];
  return y;
}

Vec NaiveFfn(const ModelConfig& c, const FfnWeights& w, const Vec& x, int layer, int token,
             const ForcedRoutes* forced) {
  const FfnConfig& f = c.ffn;
  if (f.kind == FfnKind::kDense) return NaiveExpert(c, w, 0, x);
  if (forced != nullptr) {
    const Route route = forced->Get(layer, MoeModule::kFfn, 0, token);
    Vec y(c.d_model, 0.0);
    for (size_t i = 0; i < route.experts.size(); ++i) {
      const Vec ye = NaiveExpert(c, w, route.experts[i], x);
      for (int j = 0; j < c.d_model; ++j) y[j] += route.weights[i] * ye[j];
    }
    return y;
  }
  Vec z = MatVec(w.router_w.f32(), f.n_experts, c.d_model, x);
  Vec p(f.n_experts);
  for (int e = 0; e < f.n_experts; ++e) {
    z[e] += w.router_b.empty() ? 0 : w.router_b.f32()[e];
  }
  const double mx = *std::max_element(z.begin(), z.end());
  double sum = 0;
  for (int e = 0; e < f.n_experts; ++e) sum += std::exp(z[e] - mx);
  for (int e = 0; e < f.n_experts; ++e) {
    p[e] = f.gate == FfnGate::kSoftmax ? std::exp(z[e] - mx) / sum : Sig(z[e]);
  }
  std::vector<int> order(f.n_experts);
  for (int e = 0; e < f.n_experts; ++e) order[e] = e;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return p[a] > p[b]; });
  double ksum = 0;
  for (int i = 0; i < f.top_k; ++i) ksum += p[order[i]];
  Vec y(c.d_model, 0.0);
  for (int i = 0; i < f.top_k; ++i) {
    const double g = f.renormalize ? p[order[i]] / ksum : p[order[i]];
    const Vec ye = NaiveExpert(c, w, order[i], x);
    for (int j = 0; j < c.d_model; ++j) y[j] += g * ye[j];
  }
  return y;
}

}  // namespace

Route ForcedRoutes::Get(int layer, MoeModule module, int head, int token) const {
  const int index = layout_.Find(layer, module, head);
  if (index < 0) {
    ADD_FAILURE() << "no router " << layer << "/" << ToString(module) << "/" << head;
    return {};
  }
  Route r;
  const int offset = layout_.ChoiceOffset(index);
  for (int i = 0; i < layout_[index].top_k; ++i) {
    const RouteChoice& ch = routing_[token].choices[offset + i];
    if (ch.fate == RouteFate::kDropped) continue;
    r.experts.push_back(ch.expert);
    r.weights.push_back(ch.gate);
  }
  return r;
}

std::vector<float> NaiveLogits(const ModelConfig& c, const ModelWeights& held,
                               const std::vector<int32_t>& tokens, const ForcedRoutes* forced) {
  // Half-precision weights widen exactly: the reference computes with the
  // same values in float64.
  const ModelWeights w = ConvertWeights(c, held, WeightsDtype::kF32);
  const int T = static_cast<int>(tokens.size()), d = c.d_model;
  std::vector<Vec> x(T);
  for (int t = 0; t < T; ++t) {
    x[t].assign(w.embedding.f32() + tokens[t] * d, w.embedding.f32() + (tokens[t] + 1) * d);
  }
  for (int l = 0; l < c.n_layers; ++l) {
    const LayerWeights& layer = w.layers[l];
    std::vector<Vec> xn(T);
    for (int t = 0; t < T; ++t) xn[t] = Norm(c, x[t], layer.attn_norm_w, layer.attn_norm_b);
    const std::vector<Vec> y = NaiveAttention(c, layer.attn, xn, l, forced);
    for (int t = 0; t < T; ++t) {
      for (int i = 0; i < d; ++i) x[t][i] += y[t][i];
      const Vec f =
          NaiveFfn(c, layer.ffn, Norm(c, x[t], layer.ffn_norm_w, layer.ffn_norm_b), l, t, forced);
      for (int i = 0; i < d; ++i) x[t][i] += f[i];
    }
  }
  std::vector<float> logits;
  for (int t = 0; t < T; ++t) {
    Vec l = MatVec(w.OutputHead().f32(), c.vocab_size, d,
                   Norm(c, x[t], w.final_norm_w, w.final_norm_b));
    for (int v = 0; v < c.vocab_size && c.output_bias; ++v) l[v] += w.lm_head_bias.f32()[v];
    logits.insert(logits.end(), l.begin(), l.end());
  }
  return logits;
}

}  // namespace switchserve::testing
