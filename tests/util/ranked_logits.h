// Router logits for the dispatch tests: each token ranks the experts in a
// chosen order, far enough apart that no gate function ties them.
#ifndef SWITCHSERVE_TESTS_UTIL_RANKED_LOGITS_H_
#define SWITCHSERVE_TESTS_UTIL_RANKED_LOGITS_H_

#include <vector>

namespace switchserve::testing {

// Logits [tokens, n_experts] that rank experts in the listed order for each
// token (listed experts get 3, 2, 1, ...; the rest -5).
std::vector<float> RankedLogits(const std::vector<std::vector<int>>& order, int n_experts);

}  // namespace switchserve::testing

#endif  // SWITCHSERVE_TESTS_UTIL_RANKED_LOGITS_H_
