#include "kernels/cpu/cpu_ffn.h"

#include "kernels/cpu/cpu_ops.h"

namespace switchserve::cpu {

CpuFfn::CpuFfn(const ModelConfig& config, const DispatchConfig& dispatch, MatmulRunner* runner,
               WorkerPool* pool, const OneRowWeights* one_row)
    : ffn_(config.ffn),
      dispatch_(dispatch),
      d_(config.d_model),
      runner_(runner),
      pool_(pool),
      one_row_(one_row),
      routers_(pool) {}

void CpuFfn::Run(const FfnWeights& w, int tokens, const float* xn, float* x, int router_index,
                 const RoutingRecorder& recorder) {
  const int T = tokens, F = ffn_.d_ff, d = d_;
  if (ffn_.kind == FfnKind::kDense) {
    Grow(hidden_, static_cast<size_t>(T) * F);
    runner_->Run(WeightLayout::kRowsOut,
                 {T, F, d, xn, d, nullptr, one_row_->Matrix(w.w1, d, 0, T), hidden_.data(), F},
                 {F32OrNull(w.b1), ffn_.activation});
    MatmulArgs down{T, d, F, hidden_.data(), F, nullptr, one_row_->Matrix(w.w2, F, 0, T), x, d};
    down.accumulate = true;
    runner_->Run(WeightLayout::kRowsOut, down, {F32OrNull(w.b2)});
    return;
  }

  const int X = ffn_.n_experts;
  Grow(logits_, static_cast<size_t>(T) * X);
  runner_->Run(WeightLayout::kRowsOut,
               {T, X, d, xn, d, nullptr, one_row_->Matrix(w.router_w, d, 0, T), logits_.data(), X},
               {F32OrNull(w.router_b)});
  const GateFunction gate =
      ffn_.gate == FfnGate::kSoftmax ? GateFunction::kSoftmax : GateFunction::kSigmoid;
  routers_.Run(logits_.data(), X, 1, T, X, ffn_.top_k, gate, ffn_.renormalize, dispatch_,
               router_index, recorder, &assignments_);

  // Slot s of expert e (assignments order) owns row s of hidden_ and product_.
  const ExpertAssignments& as = assignments_;
  const int slots = as.offsets[X];
  Grow(hidden_, static_cast<size_t>(slots) * F);
  Grow(product_, static_cast<size_t>(slots) * d);
  // Each expert's up projection, then its down projection of those rows.
  tasks_.clear();
  down_tasks_.clear();
  for (int e = 0; e < X; ++e) {
    if (as.count(e) == 0) continue;
    float* hidden = hidden_.data() + static_cast<int64_t>(as.begin(e)) * F;
    tasks_.push_back(
        {WeightLayout::kRowsOut,
         {as.count(e), F, d, xn, d, as.token.data() + as.begin(e),
          one_row_->Matrix(w.w1, d, static_cast<int64_t>(e) * F * d, as.count(e)), hidden, F},
         {F32OrNull(w.b1, static_cast<int64_t>(e) * F), ffn_.activation}});
    down_tasks_.push_back({WeightLayout::kRowsOut,
                           {as.count(e), d, F, hidden, F, nullptr,
                            one_row_->Matrix(w.w2, F, static_cast<int64_t>(e) * d * F, as.count(e)),
                            product_.data() + static_cast<int64_t>(as.begin(e)) * d, d},
                           {F32OrNull(w.b2, static_cast<int64_t>(e) * d)}});
  }
  runner_->RunPairs(tasks_, down_tasks_);
  outputs_.assign(1, {&as, product_.data(), x, d});
  AddExpertOutputs(outputs_, d, T, pool_, runner_->parallel_min_macs());
}

}  // namespace switchserve::cpu
