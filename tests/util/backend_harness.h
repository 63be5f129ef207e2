// A Backend under test (any of BackendsUnderTest()) plus the block
// accounting a scheduler would do, and small helpers for comparing logits.
#ifndef SWITCHSERVE_TESTS_UTIL_BACKEND_HARNESS_H_
#define SWITCHSERVE_TESTS_UTIL_BACKEND_HARNESS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "engine/model/model_config.h"
#include "engine/model/model_weights.h"
#include "engine/runtime/backend.h"
#include "engine/runtime/kv_cache.h"
#include "tests/util/backends_under_test.h"

namespace switchserve::testing {

inline constexpr int kHarnessBlockSize = 4;
inline constexpr int kHarnessNumBlocks = 64;

std::vector<int32_t> RandomTokens(int n, int vocab, uint64_t seed);
// max |a - b| / max |b|
double RelError(const std::vector<float>& a, const std::vector<float>& b);
// Row `row` of a [rows, width] matrix.
std::vector<float> Slice(const std::vector<float>& v, size_t row, size_t width);

// A backend made by `backend` with a KV cache of kHarnessNumBlocks blocks of
// kHarnessBlockSize tokens; a few blocks are held by a dummy sequence so real
// ones get scattered ids. Each sequence carries its capacity group loads
// from step to step, as the engine's requests do. With `prefix_caching`, the
// cache is a prefix-caching one (KvCacheOptions::prefix_caching), for tests
// that hand one sequence's blocks to another.
class BackendHarness {
 public:
  BackendHarness(const BackendUnderTest& backend, const ModelConfig& config,
                 const ModelWeights& weights, const DispatchConfig& dispatch,
                 bool prefix_caching = false);

  struct Chunk {
    SequenceId seq;
    std::vector<int32_t> tokens;
    int start;
    LogitsMode logits = LogitsMode::kAll;
    bool collect = false;
    SampleRequest sample = {};
  };
  // Reserves blocks for every chunk and runs them as one step.
  absl::Status Step(const std::vector<Chunk>& chunks, StepOutput* out);
  // Logits of all rows of one chunk run alone.
  std::vector<float> Run(SequenceId seq, const std::vector<int32_t>& tokens, int start);

  Backend& backend() { return *backend_; }
  KvBlockAllocator& alloc() { return kv_cache_->allocator(); }
  // The capacity-group loads `seq` carries.
  GroupLoads& group_loads(SequenceId seq) { return group_loads_[seq]; }

 private:
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<KvCache> kv_cache_;
  std::map<SequenceId, GroupLoads> group_loads_;
};

}  // namespace switchserve::testing

#endif  // SWITCHSERVE_TESTS_UTIL_BACKEND_HARNESS_H_
