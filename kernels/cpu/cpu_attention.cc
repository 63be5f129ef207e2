#include "kernels/cpu/cpu_attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace switchserve::cpu {
namespace {

// Chunks of at least this many tokens attend tile by tile with GEMMs.
constexpr int kTiledMinTokens = 8;
// Query rows per tile of the GEMM attention.
constexpr int kQueryTile = 64;

}  // namespace

CpuAttention::CpuAttention(const ModelConfig& config, const DispatchConfig& dispatch,
                           int num_threads, int64_t parallel_min_macs)
    : attn_(config.attention),
      dispatch_(dispatch),
      d_(config.d_model),
      num_threads_(std::max(1, num_threads)),
      parallel_min_macs_(parallel_min_macs),
      rope_(config.attention.RotaryDims(), config.attention.rope_base) {}

GateFunction CpuAttention::gate() const {
  return attn_.gate == AttentionGate::kSigmoid ? GateFunction::kSigmoid
                                               : GateFunction::kSoftmaxTopK;
}

void CpuAttention::Run(const AttentionWeights& w, const StepBatch& step, const float* xn, float* x,
                       float* k_cache, float* v_cache, const XlPositionKeys& positions,
                       int router_base, const RoutingRecorder& recorder) {
  const int T = step.num_tokens();
  const int H = attn_.n_heads, G = attn_.n_kv_heads, dh = attn_.head_dim;
  const int ev = attn_.CachedValuesPerKvHead();
  const float scale = static_cast<float>(std::pow(static_cast<double>(dh), -0.25));
  Grow(q_, static_cast<size_t>(T) * H * dh);
  Grow(k_, static_cast<size_t>(T) * G * dh);
  Grow(v_, static_cast<size_t>(T) * G * ev * dh);
  Grow(a_, static_cast<size_t>(T) * H * dh);
  Grow(gather_, static_cast<size_t>(T) * std::max(d_, dh));
  Grow(product_, static_cast<size_t>(T) * std::max(d_, dh));

  GemmNT(T, H * dh, d_, scale, xn, d_, w.q.ptr(), d_, 0.0f, q_.data(), H * dh);
  GemmNT(T, G * dh, d_, scale, xn, d_, w.k.ptr(), d_, 0.0f, k_.data(), G * dh);
  // Scratch follows the positions in use (ValidateStepBatch keeps them below
  // max_seq_len), not the model's context length.
  const int used_positions =
      T > 0 ? *std::max_element(step.positions.begin(), step.positions.end()) + 1 : 0;
  rope_.Reserve(used_positions);
  for (int t = 0; t < T; ++t) {
    rope_.Apply(q_.data() + static_cast<int64_t>(t) * H * dh, H, dh, step.positions[t]);
    rope_.Apply(k_.data() + static_cast<int64_t>(t) * G * dh, G, dh, step.positions[t]);
  }
  ComputeValues(w, step, xn, router_base, recorder);

  // Append the step's keys and values to the cache.
  const int64_t krow = static_cast<int64_t>(G) * dh;
  const int64_t vrow = static_cast<int64_t>(G) * ev * dh;
  for (int t = 0; t < T; ++t) {
    std::memcpy(k_cache + step.cache_rows[t] * krow, k_.data() + t * krow, krow * sizeof(float));
    std::memcpy(v_cache + step.cache_rows[t] * vrow, v_.data() + t * vrow, vrow * sizeof(float));
  }
  Attend(step, k_cache, v_cache, positions);
  ProjectOutput(w, step, xn, x, router_base, recorder);
}

void CpuAttention::ComputeValues(const AttentionWeights& w, const StepBatch& step, const float* xn,
                                 int router_base, const RoutingRecorder& recorder) {
  const int T = step.num_tokens();
  const int G = attn_.n_kv_heads, dh = attn_.head_dim, E = attn_.n_experts;
  if (!attn_.IsRouted()) {
    GemmNT(T, G * dh, d_, 1.0f, xn, d_, w.v.ptr(), d_, 0.0f, v_.data(), G * dh);
    return;
  }
  // Value routers: logits [T, R*E], one dispatch per router head.
  const int routers = attn_.ValueRouterHeads();
  Grow(logits_, static_cast<size_t>(T) * routers * E);
  GemmNT(T, routers * E, d_, 1.0f, xn, d_, w.sel_v.ptr(), d_, 0.0f, logits_.data(), routers * E);
  if (assignments_.size() < static_cast<size_t>(routers)) assignments_.resize(routers);
  for (int r = 0; r < routers; ++r) {
    RouteAndDispatch(logits_.data() + r * E, routers * E, T, E, attn_.top_k, gate(), false,
                     dispatch_, router_base + r, recorder, &decision_, &assignments_[r]);
  }

  if (attn_.value_routing == ValueRouting::kDestination) {
    // Every expert's values are cached: v_[t, g*E + e, :] = x_t . v[g*E + e].
    for (int ge = 0; ge < G * E; ++ge) {
      GemmNN(T, dh, d_, 1.0f, xn, d_, w.v.ptr() + static_cast<int64_t>(ge) * d_ * dh, dh, 0.0f,
             v_.data() + static_cast<int64_t>(ge) * dh, G * E * dh);
    }
    // The destination token's kept gates, as a dense [T, G, E] matrix.
    Grow(vweight_, static_cast<size_t>(T) * G * E);
    std::fill(vweight_.begin(), vweight_.begin() + static_cast<int64_t>(T) * G * E, 0.0f);
    for (int g = 0; g < G; ++g) {
      const ExpertAssignments& as = assignments_[attn_.shared_router ? 0 : g];
      for (int e = 0; e < E; ++e) {
        for (int32_t s = as.begin(e); s < as.end(e); ++s) {
          vweight_[(static_cast<int64_t>(as.token[s]) * G + g) * E + e] = as.weight[s];
        }
      }
    }
    return;
  }

  // Source routing: grouped matmul per (KV head, expert) over its tokens.
  std::fill(v_.begin(), v_.begin() + static_cast<int64_t>(T) * G * dh, 0.0f);
  for (int g = 0; g < G; ++g) {
    const ExpertAssignments& as = assignments_[attn_.shared_router ? 0 : g];
    for (int e = 0; e < E; ++e) {
      const int n = as.count(e);
      if (n == 0) continue;
      GatherExpertRows(as, e, xn, d_, d_, gather_.data());
      GemmNN(n, dh, d_, 1.0f, gather_.data(), d_,
             w.v.ptr() + static_cast<int64_t>(g * E + e) * d_ * dh, dh, 0.0f, product_.data(), dh);
      ScatterAddExpertRows(as, e, product_.data(), dh, v_.data() + static_cast<int64_t>(g) * dh,
                           static_cast<int64_t>(G) * dh);
    }
  }
}

void CpuAttention::Attend(const StepBatch& step, const float* k_cache, const float* v_cache,
                          const XlPositionKeys& positions) {
  const int H = attn_.n_heads, G = attn_.n_kv_heads, dh = attn_.head_dim;
  const int ev = attn_.CachedValuesPerKvHead();
  const int group = H / G;
  const bool destination = ev > 1;
  const int64_t krow = static_cast<int64_t>(G) * dh;
  const int64_t vrow = static_cast<int64_t>(G) * ev * dh;
  // Long chunks (prefill) attend tile by tile with GEMMs; the rest (decode
  // tokens, short chunks) token by token.
  loop_tokens_.clear();
  for (int c = 0; c < step.num_sequences(); ++c) {
    const int t = step.token_offsets[c];
    const int n = step.num_tokens(c);
    if (n >= kTiledMinTokens) {
      AttendChunkTiled(step, c, t, n, k_cache, v_cache, positions);
    } else {
      for (int i = 0; i < n; ++i) loop_tokens_.push_back(t + i);
    }
  }
  const int64_t work = static_cast<int64_t>(loop_tokens_.size()) * H;
  // Small steps (decode) run on one thread: waking the OpenMP team costs more
  // than it saves and its spinning threads steal cores from OpenBLAS.
  // CpuBackendOptions::parallel_attention_min_macs sets the bar.
  int64_t macs = 0;
  for (int t : loop_tokens_) macs += static_cast<int64_t>(step.positions[t] + 1) * H * dh * ev;
  const bool parallel = num_threads_ > 1 && macs >= parallel_min_macs_;
  int score_stride = 0;  // one row of scores per thread, as long as the longest context
  for (int t : loop_tokens_) score_stride = std::max(score_stride, step.positions[t] + 1);
  Grow(scores_, static_cast<size_t>(num_threads_) * score_stride);

#pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads_) if (parallel)
  for (int64_t item = 0; item < work; ++item) {
    const int t = loop_tokens_[item / H];
    const int h = static_cast<int>(item % H);
    const int g = h / group;
    const int c = step.token_sequence[t];
    const int pos = step.positions[t];
    const int32_t* table = step.block_table(c);
    const int bs = step.block_size;
    float* score = scores_.data() + static_cast<int64_t>(omp_get_thread_num()) * score_stride;
    const float* q = q_.data() + (static_cast<int64_t>(t) * H + h) * dh;
    // XL: R_h[pos - j] for key j (cpu_xl_positions.h).
    const float* rel = positions ? positions.At(h, pos) : nullptr;

    float smax = -INFINITY;
    for (int j = 0; j <= pos; ++j) {
      const int64_t row = static_cast<int64_t>(table[j / bs]) * bs + j % bs;
      const float* kj = k_cache + row * krow + static_cast<int64_t>(g) * dh;
      float s = 0;
#pragma omp simd reduction(+ : s)
      for (int i = 0; i < dh; ++i) s += q[i] * kj[i];
      if (rel != nullptr) s += XlPositionDot(q, rel - static_cast<int64_t>(j) * dh, dh);
      score[j] = s;
      smax = std::max(smax, s);
    }
    float sum = 0;
    for (int j = 0; j <= pos; ++j) {
      score[j] = std::exp(score[j] - smax);
      sum += score[j];
    }
    const float inv = 1.0f / sum;

    float* out = a_.data() + (static_cast<int64_t>(t) * H + h) * dh;
    std::fill(out, out + dh, 0.0f);
    for (int e = 0; e < ev; ++e) {
      float wt = 1.0f;
      int64_t voff = static_cast<int64_t>(g) * dh;
      if (destination) {
        wt = vweight_[(static_cast<int64_t>(t) * G + g) * ev + e];
        if (wt == 0.0f) continue;
        voff = static_cast<int64_t>(g * ev + e) * dh;
      }
      const float pw = wt * inv;
      for (int j = 0; j <= pos; ++j) {
        const int64_t row = static_cast<int64_t>(table[j / bs]) * bs + j % bs;
        const float* vj = v_cache + row * vrow + voff;
        const float p = score[j] * pw;
#pragma omp simd
        for (int i = 0; i < dh; ++i) out[i] += p * vj[i];
      }
    }
  }
}

void CpuAttention::AttendChunkTiled(const StepBatch& step, int c, int t0, int n,
                                    const float* k_cache, const float* v_cache,
                                    const XlPositionKeys& positions) {
  const int H = attn_.n_heads, G = attn_.n_kv_heads, dh = attn_.head_dim;
  const int ev = attn_.CachedValuesPerKvHead();
  const int group = H / G;
  const int start = step.positions[t0];
  const int keys = start + n;
  const int64_t krow = static_cast<int64_t>(G) * dh;
  const int64_t vrow = static_cast<int64_t>(G) * ev * dh;
  const int64_t vdim = static_cast<int64_t>(ev) * dh;
  Grow(keys_, static_cast<size_t>(keys) * dh);
  Grow(values_, static_cast<size_t>(keys) * vdim);
  Grow(tile_scores_, static_cast<size_t>(kQueryTile) * keys);
  Grow(tile_out_, static_cast<size_t>(kQueryTile) * dh);

  for (int g = 0; g < G; ++g) {
    // This KV head's keys and values of the sequence, made contiguous.
    for (int j = 0; j < keys; ++j) {
      const int64_t row = step.CacheRow(c, j);
      std::memcpy(keys_.data() + static_cast<int64_t>(j) * dh,
                  k_cache + row * krow + static_cast<int64_t>(g) * dh, dh * sizeof(float));
      std::memcpy(values_.data() + j * vdim, v_cache + row * vrow + g * vdim, vdim * sizeof(float));
    }
    for (int h = g * group; h < (g + 1) * group; ++h) {
      for (int i0 = 0; i0 < n; i0 += kQueryTile) {
        const int rows = std::min(kQueryTile, n - i0);
        const int span = start + i0 + rows;  // keys the tile's last query sees
        float* score = tile_scores_.data();
        float* out = a_.data() + (static_cast<int64_t>(t0 + i0) * H + h) * dh;
        GemmNT(rows, span, dh, 1.0f, q_.data() + (static_cast<int64_t>(t0 + i0) * H + h) * dh,
               H * dh, keys_.data(), dh, 0.0f, score, span);
        for (int r = 0; r < rows; ++r) {
          float* sr = score + static_cast<int64_t>(r) * span;
          const int visible = start + i0 + r + 1;  // causal
          if (positions) {
            // XL: + q . R_h[i - j], i = visible - 1 (cpu_xl_positions.h).
            const float* q = q_.data() + (static_cast<int64_t>(t0 + i0 + r) * H + h) * dh;
            const float* rel = positions.At(h, visible - 1);
            for (int j = 0; j < visible; ++j) {
              sr[j] += XlPositionDot(q, rel - static_cast<int64_t>(j) * dh, dh);
            }
          }
          float smax = -INFINITY;
          for (int j = 0; j < visible; ++j) smax = std::max(smax, sr[j]);
          float sum = 0;
          for (int j = 0; j < visible; ++j) {
            sr[j] = std::exp(sr[j] - smax);
            sum += sr[j];
          }
          const float inv = 1.0f / sum;
          for (int j = 0; j < visible; ++j) sr[j] *= inv;
          std::fill(sr + visible, sr + span, 0.0f);
        }
        if (ev == 1) {
          GemmNN(rows, dh, span, 1.0f, score, span, values_.data(), dh, 0.0f, out, H * dh);
          continue;
        }
        // Destination routing: the query's gate weights each expert's values.
        for (int r = 0; r < rows; ++r) {
          std::fill(out + static_cast<int64_t>(r) * H * dh,
                    out + static_cast<int64_t>(r) * H * dh + dh, 0.0f);
        }
        for (int e = 0; e < ev; ++e) {
          GemmNN(rows, dh, span, 1.0f, score, span, values_.data() + static_cast<int64_t>(e) * dh,
                 static_cast<int>(vdim), 0.0f, tile_out_.data(), dh);
          for (int r = 0; r < rows; ++r) {
            const float wt = vweight_[(static_cast<int64_t>(t0 + i0 + r) * G + g) * ev + e];
            if (wt == 0.0f) continue;
            float* dst = out + static_cast<int64_t>(r) * H * dh;
            const float* src = tile_out_.data() + static_cast<int64_t>(r) * dh;
#pragma omp simd
            for (int i = 0; i < dh; ++i) dst[i] += wt * src[i];
          }
        }
      }
    }
  }
}

void CpuAttention::ProjectOutput(const AttentionWeights& w, const StepBatch& step, const float* xn,
                                 float* x, int router_base, const RoutingRecorder& recorder) {
  const int T = step.num_tokens();
  const int H = attn_.n_heads, dh = attn_.head_dim, E = attn_.n_experts;
  if (!attn_.IsRouted()) {
    if (attn_.kind == AttentionKind::kSwitchHead) {
      // E = 1: a per-head output gate sigmoid(sel_o x)_h scales a_h.
      Grow(logits_, static_cast<size_t>(T) * H);
      GemmNT(T, H, d_, 1.0f, xn, d_, w.sel_o.ptr(), d_, 0.0f, logits_.data(), H);
      for (int t = 0; t < T; ++t) {
        for (int h = 0; h < H; ++h) {
          const float gv = Sigmoid(logits_[static_cast<int64_t>(t) * H + h]);
          float* a = a_.data() + (static_cast<int64_t>(t) * H + h) * dh;
          for (int i = 0; i < dh; ++i) a[i] *= gv;
        }
      }
    }
    GemmNT(T, d_, H * dh, 1.0f, a_.data(), H * dh, w.o.ptr(), H * dh, 1.0f, x, d_);
    return;
  }

  const int routers = attn_.OutputRouterHeads();
  const int base = router_base + attn_.ValueRouterHeads();
  Grow(logits_, static_cast<size_t>(T) * routers * E);
  GemmNT(T, routers * E, d_, 1.0f, xn, d_, w.sel_o.ptr(), d_, 0.0f, logits_.data(), routers * E);
  if (assignments_.size() < static_cast<size_t>(routers)) assignments_.resize(routers);
  for (int r = 0; r < routers; ++r) {
    RouteAndDispatch(logits_.data() + r * E, routers * E, T, E, attn_.top_k, gate(), false,
                     dispatch_, base + r, recorder, &decision_, &assignments_[r]);
  }
  for (int h = 0; h < H; ++h) {
    const ExpertAssignments& as = assignments_[attn_.shared_router ? 0 : h];
    for (int e = 0; e < E; ++e) {
      const int n = as.count(e);
      if (n == 0) continue;
      GatherExpertRows(as, e, a_.data() + static_cast<int64_t>(h) * dh,
                       static_cast<int64_t>(H) * dh, dh, gather_.data());
      GemmNN(n, d_, dh, 1.0f, gather_.data(), dh,
             w.o.ptr() + static_cast<int64_t>(h * E + e) * dh * d_, d_, 0.0f, product_.data(), d_);
      ScatterAddExpertRows(as, e, product_.data(), d_, x, d_);
    }
  }
}

}  // namespace switchserve::cpu
