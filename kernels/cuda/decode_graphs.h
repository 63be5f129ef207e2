// CUDA graphs for decode steps. A step whose every sequence decodes one token
// is padded to the smallest batch-size bucket that holds it (1, 2, 4, ...,
// 256 sequences) with sequences of one token that write only a scratch KV
// block, return nothing and stay out of the statistics; its launches are then
// shaped by the bucket alone (cuda_step.h), captured once per bucket into a
// graph and replayed, which removes the launch overhead of a few hundred
// small kernels per step.
//
// Padding rows cannot change a real row: every kernel computes a token from
// its own data (the isolation property), the dispatch of a padding row can
// take no slot a real row could want (only dropless dispatch and the
// sequence scope run from graphs: there a padding sequence opens its own
// capacity group at position 0, and the capacity per group is fixed by the
// config), and the statistics count the first real_tokens rows only.
//
// Under the SIMT executor there are no graphs: the padded step runs eagerly,
// so the bucket choice and the padding are tested there; capture and replay
// first run on a GPU.
#ifndef SWITCHSERVE_KERNELS_CUDA_DECODE_GRAPHS_H_
#define SWITCHSERVE_KERNELS_CUDA_DECODE_GRAPHS_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "engine/model/model_config.h"
#include "engine/runtime/step_batch.h"

namespace switchserve::cuda {

inline constexpr int kMaxDecodeBucket = 256;

// The smallest bucket (a power of two) holding `sequences`; 0 when more than
// kMaxDecodeBucket.
int DecodeBucket(int sequences);

// Logprobs a graph step can return per token (the server's limit).
inline constexpr int kGraphMaxLogprobs = 20;
// allowed_token_ids a graph step holds per sequence; a step with a longer
// list runs without a graph.
inline constexpr int kGraphMaxAllowedTokenIds = 1024;

// Whether a graph may run `batch` under `dispatch`: every sequence decodes one
// token, at most kMaxDecodeBucket of them, and the dispatch is dropless or
// per sequence (a capacity of the step scope would count padding rows and
// change with the step's tokens); and the step fits the bucket's fixed
// arrays: block tables of at most ceil(max_seq_len / block_size) blocks,
// histories of at most max_seq_len ids, at most kGraphMaxLogprobs logprobs,
// kMaxSampleBiases logit biases and kGraphMaxAllowedTokenIds allowed ids;
// and, all sequences together, at most `kv_blocks` blocks and as many
// penalised history ids as those blocks hold tokens (a sane batch's
// sequences hold their blocks in a cache of kv_blocks side by side, so the
// arrays are sized by the cache).
bool GraphEligible(const StepBatch& batch, const DispatchConfig& dispatch, int max_seq_len,
                   int64_t kv_blocks);

// `padded` = `batch`, then sequences up to `bucket` of one token (id 0) at
// position 0 with block table {scratch_block}, returning nothing.
void PadDecodeStep(const StepBatch& batch, int bucket, int32_t scratch_block, StepBatch* padded);

// One graph per bucket, valid while the device addresses it captured are:
// `epoch` changes whenever a buffer the launches use is reallocated.
class DecodeGraphs {
 public:
  DecodeGraphs() = default;
  ~DecodeGraphs();
  DecodeGraphs(const DecodeGraphs&) = delete;
  DecodeGraphs& operator=(const DecodeGraphs&) = delete;

  // Runs `launches` for `bucket` on `stream`: replays the bucket's graph,
  // capturing it first when it has none for this epoch. Under emulation it
  // calls `launches` directly.
  absl::Status Run(int bucket, uint64_t epoch, cudaStream_t stream,
                   const std::function<absl::Status()>& launches);

  // For tests and logs.
  int captures() const { return captures_; }
  int replays() const { return replays_; }
  int padded_steps() const { return padded_steps_; }

 private:
  struct Entry {
    void* exec = nullptr;  // cudaGraphExec_t (GPU builds only)
    uint64_t epoch = 0;
  };
  std::vector<Entry> entries_;  // by log2(bucket)
  int captures_ = 0;
  int replays_ = 0;
  int padded_steps_ = 0;
};

}  // namespace switchserve::cuda

#endif  // SWITCHSERVE_KERNELS_CUDA_DECODE_GRAPHS_H_
