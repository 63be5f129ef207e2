// One step of the CUDA backend as the device sees it: the StepBatch packed
// into one upload (tokens, positions, cache rows, block tables, the query
// tiles of attention, the dispatch segments and carried capacity loads of
// the sequence scope, the rows of the output head, the sampling requests),
// the sizes every launch of the step is shaped by, and one result buffer
// (sampled tokens, routing statistics, the loads the sequences carry on,
// logits rows, traces) read back in one copy. Internal to the CUDA backend.
//
// Shapes are exact for an eager step. A graph step (a decode step padded to
// a batch-size bucket, decode_graphs.h) uses shapes that depend on the bucket
// only, so that every launch and every device address is the same from one
// step of the bucket to the next; what is real is in the uploaded data.
#ifndef SWITCHSERVE_KERNELS_CUDA_CUDA_STEP_H_
#define SWITCHSERVE_KERNELS_CUDA_CUDA_STEP_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "engine/moe/router_layout.h"
#include "engine/runtime/backend.h"
#include "engine/runtime/step_batch.h"
#include "kernels/cuda/device_memory.h"
#include "kernels/cuda/sampling.h"

namespace switchserve::cuda {

// What the step layout needs to know of the model and cache.
struct StepModel {
  int vocab = 0;
  int max_seq_len = 0;  // positions a step can hold: min(the context, the KV cache's rows)
  int block_size = 0;
  // The KV cache's blocks. A step's sequences hold their blocks in it side by
  // side, so their block tables and histories (the tokens so far) together
  // never exceed its blocks and rows: a decode graph's arrays for them are
  // sized by the cache, not by bucket x max_seq_len.
  int64_t kv_blocks = 0;
  int query_tile = 1;      // attention queries per block
  int segment_tokens = 1;  // attention key segment
  const RouterLayout* layout = nullptr;
  // Sequence capacity scope: G, the positions of a capacity group (dispatch
  // segments split a sequence's chunk where a group opens); 0 in step scope.
  int capacity_group = 0;
  // Whether sequences carry capacity loads (DispatchConfig::CarriesGroupLoads).
  bool carries_loads = false;
};

// The sizes launches are shaped by.
struct StepShape {
  int tokens = 0;  // rows of every activation (real + padding)
  int sequences = 0;
  int tiles = 0;     // attention query tiles
  int segments = 1;  // attention key segments launched
  int max_segments = 1;
  int head_rows = 0;  // rows through the output head
  int samples = 0;    // sampling blocks
  int max_logprobs = 0;
  int64_t block_entries = 0;
  int64_t history = 0;
  int dispatch_segments = 0;  // sequence scope: see DeviceStep::dispatch_first
};

// Device addresses of the uploaded step.
struct DeviceStep {
  const int32_t* token_ids = nullptr;
  const int32_t* positions = nullptr;
  const int32_t* token_sequence = nullptr;
  const int64_t* cache_rows = nullptr;
  const int32_t* block_tables = nullptr;
  const int32_t* block_offsets = nullptr;
  const int32_t* tile_first = nullptr;
  const int32_t* tile_count = nullptr;
  const int32_t* head_rows = nullptr;  // step row of each head row
  const DeviceSampleParams* samples = nullptr;
  const int32_t* history = nullptr;
  const int32_t* counted_tokens = nullptr;  // [1]: rows [0, n) are real
  // Sequence scope (dispatch_plan.h, SequenceScope): runs of one sequence's
  // tokens that start at its first token or where a capacity group opens;
  // null in step scope.
  const int32_t* dispatch_first = nullptr;  // [dispatch_segments]
  const int32_t* dispatch_count = nullptr;
  // The capacity loads each sequence carries in, [sequences, total experts]
  // (RouterLayout::ExpertOffset columns); null when none are carried.
  const int32_t* carried_loads = nullptr;
};

// Device addresses of the step's results.
struct DeviceResults {
  int32_t* sample_token = nullptr;
  float* sample_logprob = nullptr;
  int32_t* top_ids = nullptr;  // [samples, max_logprobs]
  float* top_logprobs = nullptr;
  int32_t* counts = nullptr;        // per router: [4, E] routed, kept, rerouted, dropped
  double* prob_sum = nullptr;       // per router: [E]
  float* logits = nullptr;          // [head_rows, vocab]
  int32_t* trace_expert = nullptr;  // per router: [tokens, k]
  float* trace_gate = nullptr;
  uint8_t* trace_fate = nullptr;
  // The loads each sequence carries out of the step, as carried_loads.
  int32_t* carried_out = nullptr;
};

class StepIo {
 public:
  explicit StepIo(const StepModel& model);

  // Lays out `batch` (validated) for the device, drawing the uniform of each
  // non-greedy sampling request from its generator. `bucket` > 0: a decode
  // step padded to `bucket` sequences of one token each (`batch` already
  // padded, its first `real_tokens` rows real); shapes from the bucket alone.
  // `carried` holds the loads the real sequences carry in (the rows of
  // StepGroupLoads, [sequences, total experts]); null when none are carried.
  absl::Status Prepare(const StepBatch& batch, int real_tokens, int bucket, const int32_t* carried);
  // Copies the packed inputs to the device (queued on `stream`).
  absl::Status Upload(cudaStream_t stream);
  // Queues the copy of the results back (traces when `traces`), then waits.
  absl::Status Download(cudaStream_t stream, bool traces);
  // Fills `out` from the downloaded results.
  void Fill(const StepBatch& batch, StepOutput* out) const;
  // Copies the downloaded loads the real sequences carry out into `carried`
  // (the rows Prepare got, for StepGroupLoads::Commit).
  void CarriedOut(int32_t* carried) const;
  // The most rows one expert of a router with `capacity` slots per group can
  // be given this step: the sum over dispatch segments of min(tokens,
  // capacity) (a segment lies in one group); the step's tokens in step
  // scope.
  int64_t MaxSequenceScopeRows(int64_t capacity) const;

  const StepShape& shape() const { return shape_; }
  // The bytes of the packed inputs on the device, and those Upload copies.
  size_t input_bytes() const { return input_bytes_; }
  size_t upload_bytes() const { return upload_head_bytes_ + upload_history_bytes_; }
  const DeviceStep& device() const { return device_; }
  const DeviceResults& results() const { return results_; }
  int real_tokens() const { return real_tokens_; }
  // Offsets of router r in the per-router result arrays (elements).
  int64_t counts_offset(int r) const { return 4 * expert_prefix_[r]; }
  int64_t prob_offset(int r) const { return expert_prefix_[r]; }
  int64_t trace_offset(int r) const {
    return static_cast<int64_t>(shape_.tokens) * choice_prefix_[r];
  }
  bool collect() const { return collect_; }
  // Changes whenever the device buffers above move (decode_graphs.h).
  uint64_t epoch() const { return epoch_; }

 private:
  StepModel model_;
  std::vector<int64_t> expert_prefix_;  // per router: sum of E before it
  std::vector<int64_t> choice_prefix_;  // per router: sum of top_k before it
  int64_t total_experts_ = 0;
  int64_t total_choices_ = 0;

  StepShape shape_;
  int real_tokens_ = 0;
  bool collect_ = false;
  // Host side of the plan.
  std::vector<int32_t> tile_first_, tile_count_;
  std::vector<int32_t> dispatch_first_, dispatch_count_;
  std::vector<int32_t> head_rows_;  // logit rows first, then sample-only rows, then padding
  int logit_rows_ = 0;
  struct PendingSample {
    int sequence;
    int head_row;
  };
  std::vector<PendingSample> pending_;
  std::vector<DeviceSampleParams> sample_params_;
  std::vector<int32_t> history_;

  // Upload: pinned staging and the device copy; offsets of each array.
  PinnedBuffer staging_;
  DeviceBuffer inputs_;
  size_t input_bytes_ = 0;
  // What Upload copies: everything up to the block tables' used part, and
  // the histories' used part.
  size_t upload_head_bytes_ = 0, upload_history_offset_ = 0, upload_history_bytes_ = 0;
  DeviceStep device_;
  // Results: device buffer, pinned copy, offsets.
  DeviceBuffer results_buffer_;
  PinnedBuffer results_host_;
  DeviceResults results_;
  size_t offset_sample_token_ = 0, offset_sample_logprob_ = 0, offset_top_ids_ = 0,
         offset_top_logprobs_ = 0, offset_counts_ = 0, offset_prob_sum_ = 0, offset_logits_ = 0,
         offset_trace_expert_ = 0, offset_trace_gate_ = 0, offset_trace_fate_ = 0,
         offset_carried_out_ = 0;
  int carried_rows_ = 0;  // real sequences whose carried loads come back
  size_t result_bytes_ = 0;
  size_t downloaded_ = 0;
  uint64_t epoch_ = 0;
};

}  // namespace switchserve::cuda

#endif  // SWITCHSERVE_KERNELS_CUDA_CUDA_STEP_H_
