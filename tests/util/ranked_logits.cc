#include "tests/util/ranked_logits.h"

#include <cstddef>

namespace switchserve::testing {

std::vector<float> RankedLogits(const std::vector<std::vector<int>>& order, int n_experts) {
  std::vector<float> z(order.size() * n_experts, -5.0f);
  for (size_t t = 0; t < order.size(); ++t) {
    for (size_t r = 0; r < order[t].size(); ++r) {
      z[t * n_experts + order[t][r]] = 3.0f - static_cast<float>(r);
    }
  }
  return z;
}

}  // namespace switchserve::testing
