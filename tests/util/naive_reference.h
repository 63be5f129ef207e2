// A naive reference of the model's forward pass, written straight from the
// math in docs/design.md (XL positions: docs/model-format.md): one sequence,
// float64, no paging, no BLAS, no batching, no tables (XL position keys are
// computed for each query and key). Every backend is checked against it (backend_reference_test) on
// every architecture variant, besides the Python reference's goldens.
#ifndef SWITCHSERVE_TESTS_UTIL_NAIVE_REFERENCE_H_
#define SWITCHSERVE_TESTS_UTIL_NAIVE_REFERENCE_H_

#include <cstdint>
#include <vector>

#include "engine/model/model_config.h"
#include "engine/model/model_weights.h"
#include "engine/moe/router_layout.h"
#include "engine/moe/routing.h"

namespace switchserve::testing {

// Chosen experts (rank order) and weights of one routed head.
struct Route {
  std::vector<int> experts;
  std::vector<double> weights;
};

// Routing taken from a backend's trace instead of computed: lets the reference
// replay capacity decisions (drops, reroutes) and check how they are applied.
class ForcedRoutes {
 public:
  // `routing`: one TokenRouting per token of the sequence; must outlive this.
  ForcedRoutes(const ModelConfig& config, const std::vector<TokenRouting>& routing)
      : layout_(config), routing_(routing) {}

  // The kept choices of router (layer, module, head) for `token`.
  Route Get(int layer, MoeModule module, int head, int token) const;

 private:
  RouterLayout layout_;
  const std::vector<TokenRouting>& routing_;
};

// Logits [tokens, vocab] of one sequence; routing computed from the router
// logits (dropless) unless `forced` gives it.
std::vector<float> NaiveLogits(const ModelConfig& config, const ModelWeights& weights,
                               const std::vector<int32_t>& tokens,
                               const ForcedRoutes* forced = nullptr);

}  // namespace switchserve::testing

#endif  // SWITCHSERVE_TESTS_UTIL_NAIVE_REFERENCE_H_
