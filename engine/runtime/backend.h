// The interface between the engine and the hardware. One Forward call runs
// one engine step (a StepBatch) over the paged KV cache and returns what the
// step's sequences asked for: the sampled next token of each sequence that
// samples (with its logprob and the top alternatives asked for), full logits
// only for the rows that asked for them, the routing of those rows and tokens,
// and the step's routing statistics. A device backend keeps logits, sampling
// and the cache in device memory; only those results cross this interface.
//
// Backends: kernels/cpu/ (the reference, f32 on the host) and kernels/cuda/,
// created by name through kernels/backends.h.
//
// A backend never decides who runs: the runtime builds the StepBatch, owns the
// block accounting (KvCache) and passes each sequence's block table.
// Not thread-safe: one thread calls Forward at a time.
#ifndef SWITCHSERVE_ENGINE_RUNTIME_BACKEND_H_
#define SWITCHSERVE_ENGINE_RUNTIME_BACKEND_H_

#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "engine/model/dtype.h"
#include "engine/moe/routing.h"
#include "engine/moe/routing_stats.h"
#include "engine/runtime/sampler.h"
#include "engine/runtime/step_batch.h"

namespace switchserve {

// The next token of one sampling sequence.
struct SampledToken {
  int32_t sequence = 0;  // index into StepBatch::sequences
  // token_id, its logprob under the raw logits, the params->logprobs most
  // likely alternatives.
  SampleResult sample;
  TokenRouting routing;  // of the sequence's last token, when it collects routing
};

struct StepOutput {
  // One per sequence with a SampleRequest, in sequence order.
  std::vector<SampledToken> samples;
  // The rows of the sequences' LogitsMode (kLast: the last token, kAll: every
  // token), in step order.
  int32_t vocab_size = 0;
  std::vector<float> logits;          // [rows, vocab_size]
  std::vector<int32_t> row_sequence;  // sequence index of each row
  std::vector<int32_t> row_position;  // absolute position of each row
  std::vector<TokenRouting> routing;  // per row when any sequence collects
                                      // routing; empty for the others
  StepRoutingStats stats;             // every router (RouterLayout order), this step

  // Empty for a step of `vocab` logits a row and these routers' statistics
  // (zeroed): where every backend's Forward starts.
  void Clear(int32_t vocab, const std::vector<RouterId>& routers) {
    samples.clear();
    vocab_size = vocab;
    logits.clear();
    row_sequence.clear();
    row_position.clear();
    routing.clear();
    stats.Reset(routers);
  }
};

struct WeightCopies {
  int64_t bytes = 0;          // held
  int64_t skipped_bytes = 0;  // asked for but left out: the host's memory had no room
  // What the weights, the KV cache and the copies had to fit in (0: no
  // copies were asked for).
  int64_t budget_bytes = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // The device it runs on, as logs, GetModelInfo and metrics report it
  // ("cpu", "cuda").
  virtual std::string_view name() const = 0;
  // The build of its kernels, where it has a choice (the CPU backend's
  // instruction set: "avx512", "avx2", "generic"), as the startup log says;
  // empty otherwise.
  virtual std::string_view kernels() const { return {}; }
  // The CPU threads a step runs on (the CPU backend's pool, the engine
  // thread among them); 0 for a backend whose steps run elsewhere.
  virtual int compute_threads() const { return 0; }
  // The element type its KV cache holds (kF32 or kBF16), as metrics report it.
  virtual DType kv_cache_dtype() const = 0;
  // Bytes of cache storage per token in that element type.
  virtual int64_t KvBytesPerToken() const = 0;
  // Copies of the weights it holds in host memory beyond the model's own
  // tensors (the CPU backend's tiled copies for one-row products), known
  // from InitKvCache on.
  virtual WeightCopies weight_copies() const { return {}; }
  // Allocates storage for `num_blocks` KV blocks of `block_size` tokens.
  // Called once, by KvCache, before Forward. INVALID_ARGUMENT for
  // non-positive sizes, RESOURCE_EXHAUSTED when the storage cannot be had.
  virtual absl::Status InitKvCache(int64_t num_blocks, int block_size) = 0;
  // Runs one step: appends each sequence's K/V to the cache, advances each
  // sequence's carried capacity loads (StepSequence::group_loads, through
  // StepGroupLoads) and fills `out`. Malformed input (ValidateStepBatch,
  // StepGroupLoads::Gather) is INVALID_ARGUMENT and leaves the cache and the
  // carried loads unchanged for every sequence of the step;
  // FAILED_PRECONDITION before InitKvCache.
  virtual absl::Status Forward(const StepBatch& batch, StepOutput* out) = 0;
};

}  // namespace switchserve

#endif  // SWITCHSERVE_ENGINE_RUNTIME_BACKEND_H_
