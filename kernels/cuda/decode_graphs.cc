#include "kernels/cuda/decode_graphs.h"

#include "kernels/cuda/device_memory.h"

namespace switchserve::cuda {

int DecodeBucket(int sequences) {
  if (sequences < 1 || sequences > kMaxDecodeBucket) return 0;
  int bucket = 1;
  while (bucket < sequences) bucket *= 2;
  return bucket;
}

bool GraphEligible(const StepBatch& batch, const DispatchConfig& dispatch, int max_seq_len,
                   int64_t kv_blocks) {
  const bool per_sequence = dispatch.Dropless() || dispatch.scope == CapacityScope::kSequence;
  if (!per_sequence || batch.block_size <= 0) return false;
  const int S = batch.num_sequences();
  if (S == 0 || DecodeBucket(S) == 0 || batch.num_tokens() != S) return false;
  const int64_t max_blocks = (int64_t{max_seq_len} + batch.block_size - 1) / batch.block_size;
  int64_t blocks = 0, history = 0;
  for (int s = 0; s < S; ++s) {
    if (batch.num_tokens(s) != 1 || batch.num_blocks(s) > max_blocks) return false;
    blocks += batch.num_blocks(s);
    const SampleRequest& sample = batch.sequences[s].sample;
    if (sample.params == nullptr) continue;
    if (sample.params->logprobs > kGraphMaxLogprobs ||
        static_cast<int64_t>(sample.history.size()) > max_seq_len ||
        sample.params->logit_bias.size() + sample.params->min_tokens_ids.size() +
                sample.params->bad_words_ids.size() >
            static_cast<size_t>(kMaxSampleBiases) ||
        sample.params->allowed_token_ids.size() > static_cast<size_t>(kGraphMaxAllowedTokenIds)) {
      return false;
    }
    if (sample.params->PenalisesHistory()) history += sample.history.size();
  }
  return blocks <= kv_blocks && history <= kv_blocks * batch.block_size;
}

void PadDecodeStep(const StepBatch& batch, int bucket, int32_t scratch_block, StepBatch* padded) {
  *padded = batch;
  const int32_t token = 0;
  while (padded->num_sequences() < bucket) {
    padded->Add(absl::MakeConstSpan(&token, 1), 0, absl::MakeConstSpan(&scratch_block, 1));
  }
}

#if defined(SWITCHSERVE_SIMT_EMULATION)

DecodeGraphs::~DecodeGraphs() = default;

absl::Status DecodeGraphs::Run(int /*bucket*/, uint64_t /*epoch*/, cudaStream_t /*stream*/,
                               const std::function<absl::Status()>& launches) {
  ++padded_steps_;
  return launches();
}

#else  // a GPU

namespace {

int BucketIndex(int bucket) {
  int index = 0;
  while ((1 << index) < bucket) ++index;
  return index;
}

}  // namespace

DecodeGraphs::~DecodeGraphs() {
  for (Entry& entry : entries_) {
    if (entry.exec != nullptr) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(entry.exec));
  }
}

absl::Status DecodeGraphs::Run(int bucket, uint64_t epoch, cudaStream_t stream,
                               const std::function<absl::Status()>& launches) {
  ++padded_steps_;
  const int index = BucketIndex(bucket);
  if (entries_.size() <= static_cast<size_t>(index)) entries_.resize(index + 1);
  Entry& entry = entries_[index];
  if (entry.exec != nullptr && entry.epoch != epoch) {
    cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(entry.exec));
    entry.exec = nullptr;
  }
  if (entry.exec == nullptr) {
    SWITCHSERVE_CUDA_RETURN_IF_ERROR(
        cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "graph capture");
    const absl::Status captured = launches();
    cudaGraph_t graph = nullptr;
    const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
    if (!captured.ok()) {
      if (graph != nullptr) cudaGraphDestroy(graph);
      return captured;
    }
    SWITCHSERVE_CUDA_RETURN_IF_ERROR(ended, "graph capture");
    cudaGraphExec_t exec = nullptr;
    const cudaError_t instantiated = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    SWITCHSERVE_CUDA_RETURN_IF_ERROR(instantiated, "graph instantiation");
    entry.exec = exec;
    entry.epoch = epoch;
    ++captures_;
  }
  ++replays_;
  return CudaStatus(cudaGraphLaunch(static_cast<cudaGraphExec_t>(entry.exec), stream),
                    "graph launch");
}

#endif

}  // namespace switchserve::cuda
