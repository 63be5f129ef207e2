// The Python reference's golden vectors (tests/golden/<variant>/): a model
// directory plus golden.safetensors with the inputs, logits, routing
// statistics and routing trace of one engine step over a small batch.
// Written by tools/reference/make_goldens.py.
#ifndef SWITCHSERVE_TESTS_UTIL_GOLDEN_H_
#define SWITCHSERVE_TESTS_UTIL_GOLDEN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/moe/routing_stats.h"

namespace switchserve::testing {

struct GoldenRouter {
  RouterId id;
  RouterStepStats stats;
  double aux_loss = 0;
  // [tokens, top_k] in step order.
  std::vector<int32_t> expert;
  std::vector<int32_t> fate;  // 0 kept, 1 rerouted, 2 dropped
  std::vector<float> gate;
};

struct GoldenCase {
  std::string name;
  std::string model_dir;
  std::vector<std::vector<int32_t>> sequences;
  // The chunk schedule, when the variant has one: steps[s][b] = tokens of
  // sequence b computed in engine step s (0: not in it), in position order.
  std::vector<std::vector<int32_t>> steps;
  std::vector<float> logits;          // [total tokens, vocab], step order
  std::vector<GoldenRouter> routers;  // RouterLayout order
};

enum class GoldenFilter {
  kAll,
  kDropless,          // no capacity limit
  kBatchIndependent,  // results cannot depend on the batching: dropless or the sequence scope
};
// Variant names (directory names under tests/golden), sorted, that `filter`
// admits.
std::vector<std::string> ListGoldenVariants(GoldenFilter filter = GoldenFilter::kAll);
// Those with a chunk schedule (`steps` in golden.safetensors), sorted.
std::vector<std::string> ListScheduledGoldenVariants();
absl::StatusOr<GoldenCase> LoadGolden(const std::string& variant);

}  // namespace switchserve::testing

#endif  // SWITCHSERVE_TESTS_UTIL_GOLDEN_H_
