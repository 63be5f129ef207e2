#include "kernels/cpu/cpu_ffn.h"

#include <cstring>

#include "kernels/cpu/cpu_ops.h"

namespace switchserve::cpu {
CpuFfn::CpuFfn(const ModelConfig& config, const DispatchConfig& dispatch)
    : ffn_(config.ffn), dispatch_(dispatch), d_(config.d_model) {}

void CpuFfn::Run(const FfnWeights& w, int tokens, const float* xn, float* x, int router_index,
                 const RoutingRecorder& recorder) {
  const int T = tokens, F = ffn_.d_ff;
  Grow(hidden_, static_cast<size_t>(T) * F);
  if (ffn_.kind == FfnKind::kDense) {
    GemmNT(T, F, d_, 1.0f, xn, d_, w.w1.ptr(), d_, 0.0f, hidden_.data(), F);
    AddBiasRows(hidden_.data(), T, F, F, OrNull(w.b1, 0));
    ApplyActivation(ffn_.activation, hidden_.data(), static_cast<int64_t>(T) * F);
    GemmNT(T, d_, F, 1.0f, hidden_.data(), F, w.w2.ptr(), F, 1.0f, x, d_);
    AddBiasRows(x, T, d_, d_, OrNull(w.b2, 0));
    return;
  }

  const int X = ffn_.n_experts;
  Grow(logits_, static_cast<size_t>(T) * X);
  Grow(gather_, static_cast<size_t>(T) * d_);
  Grow(product_, static_cast<size_t>(T) * d_);
  GemmNT(T, X, d_, 1.0f, xn, d_, w.router_w.ptr(), d_, 0.0f, logits_.data(), X);
  AddBiasRows(logits_.data(), T, X, X, OrNull(w.router_b, 0));
  const GateFunction gate =
      ffn_.gate == FfnGate::kSoftmax ? GateFunction::kSoftmax : GateFunction::kSigmoid;
  RouteAndDispatch(logits_.data(), X, T, X, ffn_.top_k, gate, ffn_.renormalize, dispatch_,
                   router_index, recorder, &decision_, &assignments_);

  const ExpertAssignments& as = assignments_;
  for (int e = 0; e < X; ++e) {
    const int n = as.count(e);
    if (n == 0) continue;
    GatherExpertRows(as, e, xn, d_, d_, gather_.data());
    GemmNT(n, F, d_, 1.0f, gather_.data(), d_, w.w1.ptr() + static_cast<int64_t>(e) * F * d_, d_,
           0.0f, hidden_.data(), F);
    AddBiasRows(hidden_.data(), n, F, F, OrNull(w.b1, static_cast<int64_t>(e) * F));
    ApplyActivation(ffn_.activation, hidden_.data(), static_cast<int64_t>(n) * F);
    GemmNT(n, d_, F, 1.0f, hidden_.data(), F, w.w2.ptr() + static_cast<int64_t>(e) * d_ * F, F,
           0.0f, product_.data(), d_);
    AddBiasRows(product_.data(), n, d_, d_, OrNull(w.b2, static_cast<int64_t>(e) * d_));
    ScatterAddExpertRows(as, e, product_.data(), d_, x, d_);
  }
}

}  // namespace switchserve::cpu
