#include "kernels/cpu/cpu_attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "engine/model/dtype.h"
#include "kernels/cpu/target_clones.h"

namespace switchserve::cpu {
namespace {

// row[0, n) into the cache at element `at`, as the cache holds it.
// Built for AVX2 too: integer rounding to bf16, the same bits at any width.
SWITCHSERVE_TARGET_CLONES("avx2", "default")
void StoreRow(const float* row, int64_t n, DType dtype, void* cache, int64_t at) {
  if (dtype == DType::kBF16) {
    uint16_t* out = static_cast<uint16_t*>(cache) + at;
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) out[i] = FloatToBFloat16(row[i]);
  } else {
    std::memcpy(static_cast<float*>(cache) + at, row, n * sizeof(float));
  }
}

}  // namespace

CpuAttention::CpuAttention(const ModelConfig& config, const DispatchConfig& dispatch, KernelIsa isa,
                           MatmulRunner* runner, WorkerPool* pool, const OneRowWeights* one_row,
                           int64_t parallel_min_macs)
    : attn_(config.attention),
      dispatch_(dispatch),
      runner_(runner),
      pool_(pool),
      one_row_(one_row),
      d_(config.d_model),
      rope_(config.attention.RotaryDims(), config.attention.rope_base),
      paged_(config.attention, isa, pool, parallel_min_macs),
      gated_(runner, pool),
      routers_(pool) {}

GateFunction CpuAttention::gate() const {
  return attn_.gate == AttentionGate::kSigmoid ? GateFunction::kSigmoid
                                               : GateFunction::kSoftmaxTopK;
}

void CpuAttention::Run(const AttentionWeights& w, const StepBatch& step, const float* xn, float* x,
                       const KvLayerCache& cache, const XlPositionKeys& positions, int router_base,
                       const RoutingRecorder& recorder) {
  const int T = step.num_tokens();
  const int H = attn_.n_heads, G = attn_.n_kv_heads, dh = attn_.head_dim;
  const int ev = attn_.CachedValuesPerKvHead();
  Grow(q_, static_cast<size_t>(T) * H * dh);
  Grow(k_, static_cast<size_t>(T) * G * dh);
  Grow(v_, static_cast<size_t>(T) * G * ev * dh);
  Grow(a_, static_cast<size_t>(T) * H * dh);

  ProjectInputs(w, step, xn);
  ComputeValues(w, step, xn, router_base, recorder);

  // Each token's value row summed from its experts (source routing), its
  // queries and keys rotated, and its keys and values appended to the cache,
  // in one job over token rows (a token's rows are its own). The appends
  // write rows of the cache no one has touched yet: in a batch-32 decode
  // step of the paper shape (engine_bench, Intel Xeon VM) a rotated and
  // appended value took about as long as 30 multiply-adds of a product, so
  // they count 16 times toward sharing the job out. Scratch follows the
  // positions in use (ValidateStepBatch keeps them below max_seq_len), not
  // the model's context length.
  const int used_positions =
      T > 0 ? *std::max_element(step.positions.begin(), step.positions.end()) + 1 : 0;
  rope_.Reserve(used_positions);
  const int64_t krow = static_cast<int64_t>(G) * dh;
  const int64_t vrow = static_cast<int64_t>(G) * ev * dh;
  int64_t sums = 0;
  for (const ExpertOutputs& group : outputs_) sums += group.assignments->offsets.back() * dh;
  constexpr int64_t kAppendCost = 16;
  ForRowRanges(
      pool_, T, sums + kAppendCost * T * (H * dh + krow + vrow), runner_->parallel_min_macs(),
      [&](int begin, int end) {
        // v_ starts from zero: the G groups' rows cover each token's.
        AddExpertOutputRows(outputs_, dh, begin, end, /*from_zero=*/true);
        for (int t = begin; t < end; ++t) {
          rope_.Apply(q_.data() + static_cast<int64_t>(t) * H * dh, H, dh, step.positions[t]);
          rope_.Apply(k_.data() + t * krow, G, dh, step.positions[t]);
          StoreRow(k_.data() + t * krow, krow, cache.dtype, cache.k, step.cache_rows[t] * krow);
          StoreRow(v_.data() + t * vrow, vrow, cache.dtype, cache.v, step.cache_rows[t] * vrow);
        }
      });
  paged_.Run(step, q_.data(), cache, positions, ev > 1 ? vweight_.data() : nullptr, a_.data());
  ProjectOutput(w, step, xn, x, router_base, recorder);
}

void CpuAttention::ProjectInputs(const AttentionWeights& w, const StepBatch& step,
                                 const float* xn) {
  const int T = step.num_tokens();
  const int H = attn_.n_heads, G = attn_.n_kv_heads, dh = attn_.head_dim, E = attn_.n_experts;
  const float scale = static_cast<float>(std::pow(static_cast<double>(dh), -0.25));
  tasks_.clear();
  MatmulArgs q{T, H * dh, d_, xn, d_, nullptr, one_row_->Matrix(w.q, d_, 0, T), q_.data(), H * dh};
  q.alpha = scale;
  tasks_.push_back({WeightLayout::kRowsOut, q});
  MatmulArgs k{T, G * dh, d_, xn, d_, nullptr, one_row_->Matrix(w.k, d_, 0, T), k_.data(), G * dh};
  k.alpha = scale;
  tasks_.push_back({WeightLayout::kRowsOut, k});
  if (!attn_.IsRouted()) {
    tasks_.push_back(
        {WeightLayout::kRowsOut,
         {T, G * dh, d_, xn, d_, nullptr, one_row_->Matrix(w.v, d_, 0, T), v_.data(), G * dh}});
    if (attn_.kind == AttentionKind::kSwitchHead) {  // E = 1: the per-head output gates
      Grow(output_logits_, static_cast<size_t>(T) * H);
      tasks_.push_back({WeightLayout::kRowsOut,
                        {T, H, d_, xn, d_, nullptr, one_row_->Matrix(w.sel_o, d_, 0, T),
                         output_logits_.data(), H}});
    }
  } else {
    const int value_routers = attn_.ValueRouterHeads() * E;
    const int output_routers = attn_.OutputRouterHeads() * E;
    Grow(value_logits_, static_cast<size_t>(T) * value_routers);
    Grow(output_logits_, static_cast<size_t>(T) * output_routers);
    tasks_.push_back({WeightLayout::kRowsOut,
                      {T, value_routers, d_, xn, d_, nullptr, one_row_->Matrix(w.sel_v, d_, 0, T),
                       value_logits_.data(), value_routers}});
    tasks_.push_back({WeightLayout::kRowsOut,
                      {T, output_routers, d_, xn, d_, nullptr, one_row_->Matrix(w.sel_o, d_, 0, T),
                       output_logits_.data(), output_routers}});
  }
  runner_->Run(tasks_);
}

void CpuAttention::ComputeValues(const AttentionWeights& w, const StepBatch& step, const float* xn,
                                 int router_base, const RoutingRecorder& recorder) {
  const int T = step.num_tokens();
  const int G = attn_.n_kv_heads, dh = attn_.head_dim, E = attn_.n_experts;
  outputs_.clear();
  if (!attn_.IsRouted()) return;  // v was projected with q and k
  // Value routers: logits [T, R*E], one dispatch per router head.
  const int routers = attn_.ValueRouterHeads();
  if (assignments_.size() < static_cast<size_t>(routers)) assignments_.resize(routers);
  routers_.Run(value_logits_.data(), routers * E, routers, T, E, attn_.top_k, gate(), false,
               dispatch_, router_base, recorder, assignments_.data());

  tasks_.clear();
  if (attn_.value_routing == ValueRouting::kDestination) {
    // Every expert's values are cached: v_[t, g*E + e, :] = x_t . v[g*E + e].
    for (int ge = 0; ge < G * E; ++ge) {
      tasks_.push_back({WeightLayout::kRowsIn,
                        {T, dh, d_, xn, d_, nullptr,
                         one_row_->Matrix(w.v, dh, static_cast<int64_t>(ge) * d_ * dh, T),
                         v_.data() + static_cast<int64_t>(ge) * dh, G * E * dh}});
    }
    runner_->Run(tasks_);
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

  // Source routing: one product per (KV head, expert) over the rows routed to
  // it, all in one group; then each token's kept values summed in expert order.
  int64_t slots = 0;
  for (int g = 0; g < G; ++g) slots += assignments_[attn_.shared_router ? 0 : g].offsets[E];
  Grow(product_, static_cast<size_t>(slots) * dh);
  int64_t base = 0;
  for (int g = 0; g < G; ++g) {
    const ExpertAssignments& as = assignments_[attn_.shared_router ? 0 : g];
    for (int e = 0; e < E; ++e) {
      if (as.count(e) == 0) continue;
      tasks_.push_back(
          {WeightLayout::kRowsIn,
           {as.count(e), dh, d_, xn, d_, as.token.data() + as.begin(e),
            one_row_->Matrix(w.v, dh, static_cast<int64_t>(g * E + e) * d_ * dh, as.count(e)),
            product_.data() + (base + as.begin(e)) * dh, dh}});
    }
    base += as.offsets[E];
  }
  runner_->Run(tasks_);
  base = 0;
  for (int g = 0; g < G; ++g) {
    const ExpertAssignments& as = assignments_[attn_.shared_router ? 0 : g];
    outputs_.push_back({&as, product_.data() + base * dh, v_.data() + static_cast<int64_t>(g) * dh,
                        static_cast<int64_t>(G) * dh});
    base += as.offsets[E];
  }
}

void CpuAttention::ProjectOutput(const AttentionWeights& w, const StepBatch& step, const float* xn,
                                 float* x, int router_base, const RoutingRecorder& recorder) {
  (void)xn;  // the output routers' logits were computed with q and k
  const int T = step.num_tokens();
  const int H = attn_.n_heads, dh = attn_.head_dim, E = attn_.n_experts;
  if (!attn_.IsRouted()) {
    if (attn_.kind == AttentionKind::kSwitchHead) {
      // E = 1: a per-head output gate sigmoid(sel_o x)_h scales a_h.
      for (int t = 0; t < T; ++t) {
        for (int h = 0; h < H; ++h) {
          const float gv = Sigmoid(output_logits_[static_cast<int64_t>(t) * H + h]);
          float* a = a_.data() + (static_cast<int64_t>(t) * H + h) * dh;
          for (int i = 0; i < dh; ++i) a[i] *= gv;
        }
      }
    }
    MatmulArgs o{T, d_, H * dh, a_.data(), H * dh, nullptr, one_row_->Matrix(w.o, H * dh, 0, T),
                 x, d_};
    o.accumulate = true;
    runner_->Run(WeightLayout::kRowsOut, o);
    return;
  }

  const int routers = attn_.OutputRouterHeads();
  const int base_router = router_base + attn_.ValueRouterHeads();
  if (assignments_.size() < static_cast<size_t>(routers)) assignments_.resize(routers);
  routers_.Run(output_logits_.data(), routers * E, routers, T, E, attn_.top_k, gate(), false,
               dispatch_, base_router, recorder, assignments_.data());
  // One product per (head, expert) over the heads' attention outputs routed to
  // it, each token's kept outputs added to x in (head, expert) order.
  gated_tasks_.clear();
  for (int h = 0; h < H; ++h) {
    const ExpertAssignments& as = assignments_[attn_.shared_router ? 0 : h];
    for (int e = 0; e < E; ++e) {
      if (as.count(e) == 0) continue;
      gated_tasks_.push_back(
          {{WeightLayout::kRowsIn,
            {as.count(e), d_, dh, a_.data() + static_cast<int64_t>(h) * dh, H * dh,
             as.token.data() + as.begin(e),
             one_row_->Matrix(w.o, d_, static_cast<int64_t>(h * E + e) * dh * d_, as.count(e)),
             nullptr, 0}},
           &as,
           e});
    }
  }
  gated_.Run(gated_tasks_, d_, T, x, d_);
}

}  // namespace switchserve::cpu
