#include "kernels/cuda/cuda_step.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "engine/runtime/sampler.h"
#include "kernels/cuda/decode_graphs.h"

namespace switchserve::cuda {
namespace {

template <typename T>
void Put(char* base, size_t offset, const std::vector<T>& values, size_t capacity) {
  if (!values.empty()) std::memcpy(base + offset, values.data(), values.size() * sizeof(T));
  if (capacity > values.size()) {
    std::memset(base + offset + values.size() * sizeof(T), 0,
                (capacity - values.size()) * sizeof(T));
  }
}

}  // namespace

StepIo::StepIo(const StepModel& model) : model_(model) {
  const RouterLayout& layout = *model.layout;
  expert_prefix_.resize(layout.size() + 1, 0);
  choice_prefix_.resize(layout.size() + 1, 0);
  for (size_t r = 0; r < layout.size(); ++r) {
    expert_prefix_[r + 1] = expert_prefix_[r] + layout[r].n_experts;
    choice_prefix_[r + 1] = choice_prefix_[r] + layout[r].top_k;
  }
  total_experts_ = expert_prefix_.back();
  total_choices_ = choice_prefix_.back();
}

absl::Status StepIo::Prepare(const StepBatch& batch, int real_tokens, int bucket,
                             const int32_t* carried) {
  const int T = batch.num_tokens();
  const int S = batch.num_sequences();
  real_tokens_ = real_tokens;
  collect_ = false;
  for (const StepSequence& sequence : batch.sequences) collect_ |= sequence.collect_routing;

  // Attention query tiles: consecutive tokens of one sequence.
  tile_first_.clear();
  tile_count_.clear();
  int max_position = 0;
  for (int s = 0; s < S; ++s) {
    for (int t = batch.token_offsets[s]; t < batch.token_offsets[s + 1]; t += model_.query_tile) {
      tile_first_.push_back(t);
      tile_count_.push_back(std::min(model_.query_tile, batch.token_offsets[s + 1] - t));
    }
  }
  for (int t = 0; t < T; ++t) max_position = std::max(max_position, batch.positions[t]);

  // Dispatch segments of the sequence scope: a new one at each sequence's
  // first token and wherever a capacity group opens.
  dispatch_first_.clear();
  dispatch_count_.clear();
  if (model_.capacity_group > 0) {
    for (int t = 0; t < T; ++t) {
      const int s = batch.token_sequence[t];
      if (t == batch.token_offsets[s] || batch.positions[t] % model_.capacity_group == 0) {
        dispatch_first_.push_back(t);
        dispatch_count_.push_back(0);
      }
      ++dispatch_count_.back();
    }
  }
  // The carried rows of the real sequences (a graph step's padding
  // sequences follow them, at tokens real_tokens and on).
  carried_rows_ = 0;
  if (model_.carries_loads && carried != nullptr) {
    while (carried_rows_ < S && batch.token_offsets[carried_rows_] < real_tokens) ++carried_rows_;
  }

  // Output head rows: those returning logits (step order), then the last
  // token of each sequence that only samples.
  head_rows_.clear();
  pending_.clear();
  std::vector<int32_t> sample_rows;
  std::vector<int> sample_sequences;
  for (int s = 0; s < S; ++s) {
    const StepSequence& sequence = batch.sequences[s];
    const int begin = batch.token_offsets[s], end = batch.token_offsets[s + 1];
    if (sequence.logits == LogitsMode::kAll) {
      for (int t = begin; t < end; ++t) head_rows_.push_back(t);
    } else if (sequence.logits == LogitsMode::kLast) {
      head_rows_.push_back(end - 1);
    }
    if (sequence.sample.params == nullptr) continue;
    if (sequence.logits != LogitsMode::kNone) {
      pending_.push_back({s, static_cast<int>(head_rows_.size()) - 1});
    } else {
      sample_rows.push_back(end - 1);
      sample_sequences.push_back(s);
    }
  }
  logit_rows_ = static_cast<int>(head_rows_.size());
  for (size_t i = 0; i < sample_rows.size(); ++i) {
    pending_.push_back({sample_sequences[i], static_cast<int>(head_rows_.size())});
    head_rows_.push_back(sample_rows[i]);
  }
  // Samples in sequence order (StepOutput::samples is).
  std::sort(pending_.begin(), pending_.end(),
            [](const PendingSample& a, const PendingSample& b) { return a.sequence < b.sequence; });

  sample_params_.clear();
  history_.clear();
  int max_logprobs = 0;
  for (const PendingSample& p : pending_) {
    const SampleRequest& request = batch.sequences[p.sequence].sample;
    const SamplingParams& params = *request.params;
    DeviceSampleParams d;
    // The request's own generator draws as the host sampler would: once for a
    // non-greedy token, never for a greedy one.
    d.uniform = params.temperature == 0.0f ? 0.0 : request.rng->Uniform();
    d.temperature = params.temperature;
    d.top_p = params.top_p;
    d.min_p = params.min_p;
    d.repetition_penalty = params.repetition_penalty;
    d.presence_penalty = params.presence_penalty;
    d.frequency_penalty = params.frequency_penalty;
    d.logits_row = p.head_row;
    d.top_k = params.top_k;
    d.n_logprobs = params.logprobs;
    d.history_begin = static_cast<int32_t>(history_.size());
    if (params.PenalisesHistory()) {
      history_.insert(history_.end(), request.history.begin(), request.history.end());
    }
    d.history_end = static_cast<int32_t>(history_.size());
    d.generated_begin = static_cast<int32_t>(
        std::min<int64_t>(d.history_begin + request.prompt_length, d.history_end));
    d.bias_begin = d.history_end;
    for (const auto& [id, bias] :
         SampleBiases(params, request.history.subspan(request.prompt_length))) {
      history_.push_back(id);
      history_.push_back(std::bit_cast<int32_t>(bias));
    }
    d.bias_end = static_cast<int32_t>(history_.size());
    d.allowed_begin = d.bias_end;
    history_.insert(history_.end(), params.allowed_token_ids.begin(),
                    params.allowed_token_ids.end());
    d.allowed_end = static_cast<int32_t>(history_.size());
    sample_params_.push_back(d);
    max_logprobs = std::max(max_logprobs, params.logprobs);
  }

  StepShape& shape = shape_;
  shape.max_segments = static_cast<int>((int64_t{model_.max_seq_len} + model_.segment_tokens - 1) /
                                        model_.segment_tokens);
  if (bucket == 0) {
    shape.tokens = T;
    shape.sequences = S;
    shape.tiles = static_cast<int>(tile_first_.size());
    shape.segments = max_position / model_.segment_tokens + 1;
    shape.head_rows = static_cast<int>(head_rows_.size());
    shape.samples = static_cast<int>(sample_params_.size());
    shape.max_logprobs = max_logprobs;
    shape.block_entries = static_cast<int64_t>(batch.block_tables.size());
    shape.history = static_cast<int64_t>(history_.size());
    shape.dispatch_segments = static_cast<int>(dispatch_first_.size());
  } else {
    if (T != bucket || S != bucket || max_logprobs > kGraphMaxLogprobs) {
      return absl::InternalError("graph step: batch does not fit its bucket");
    }
    const int64_t max_blocks =
        (int64_t{model_.max_seq_len} + model_.block_size - 1) / model_.block_size;
    shape.tokens = bucket;
    shape.sequences = bucket;
    shape.tiles = bucket;
    shape.segments = shape.max_segments;
    shape.head_rows = bucket;
    shape.samples = bucket;
    shape.max_logprobs = kGraphMaxLogprobs;
    // Padding sequences add a block each (PadDecodeStep); they have no history.
    shape.block_entries = std::min(bucket * max_blocks, model_.kv_blocks + bucket);
    // The penalised histories, then each sequence's logit bias pairs and
    // allowed ids.
    shape.history =
        std::min(bucket * int64_t{model_.max_seq_len}, model_.kv_blocks * model_.block_size) +
        bucket * int64_t{2 * kMaxSampleBiases + kGraphMaxAllowedTokenIds};
    // One token per sequence: one segment each.
    shape.dispatch_segments = model_.capacity_group > 0 ? bucket : 0;
    if (static_cast<int64_t>(batch.block_tables.size()) > shape.block_entries ||
        static_cast<int64_t>(history_.size()) > shape.history) {
      return absl::InternalError("graph step: block tables or history exceed the bucket");
    }
    // Every row goes through the head and a (greedy, discarded) sample.
    std::vector<bool> used(T, false);
    for (int32_t r : head_rows_) used[r] = true;
    for (int t = 0; t < T; ++t) {
      if (!used[t]) head_rows_.push_back(t);
    }
    while (static_cast<int>(sample_params_.size()) < bucket) {
      DeviceSampleParams d;
      d.logits_row = static_cast<int32_t>(sample_params_.size());
      sample_params_.push_back(d);
    }
  }

  // The upload: every array at an offset fixed by the shape. The block
  // tables and the histories come last: they are read only as far as the
  // offsets beside them say, so only their used parts are written and copied.
  PackedLayout in;
  const size_t o_tokens = in.Add(shape.tokens, 4), o_positions = in.Add(shape.tokens, 4),
               o_sequence = in.Add(shape.tokens, 4), o_rows = in.Add(shape.tokens, 8),
               o_offsets = in.Add(shape.sequences + 1, 4), o_first = in.Add(shape.tiles, 4),
               o_count = in.Add(shape.tiles, 4), o_head = in.Add(shape.head_rows, 4),
               o_samples = in.Add(shape.samples, sizeof(DeviceSampleParams)),
               o_counted = in.Add(1, 4), o_dispatch_first = in.Add(shape.dispatch_segments, 4),
               o_dispatch_count = in.Add(shape.dispatch_segments, 4);
  const size_t carried_values =
      model_.carries_loads ? static_cast<size_t>(shape.sequences) * total_experts_ : 0;
  const size_t o_carried = in.Add(carried_values, 4);
  const size_t o_tables = in.Add(shape.block_entries, 4);
  const size_t o_history = in.Add(std::max<int64_t>(shape.history, 1), 4);
  input_bytes_ = in.bytes();
  upload_head_bytes_ = o_tables + batch.block_tables.size() * 4;
  upload_history_offset_ = o_history;
  upload_history_bytes_ = history_.size() * 4;
  if (absl::Status s = staging_.Grow(input_bytes_); !s.ok()) return s;
  bool moved = false;
  if (absl::Status s = inputs_.Grow(input_bytes_, &moved); !s.ok()) return s;
  epoch_ += moved ? 1 : 0;
  char* h = staging_.get();
  Put(h, o_tokens, batch.token_ids, shape.tokens);
  Put(h, o_positions, batch.positions, shape.tokens);
  Put(h, o_sequence, batch.token_sequence, shape.tokens);
  Put(h, o_rows, batch.cache_rows, shape.tokens);
  Put(h, o_tables, batch.block_tables, batch.block_tables.size());
  Put(h, o_offsets, batch.block_offsets, shape.sequences + 1);
  Put(h, o_first, tile_first_, shape.tiles);
  Put(h, o_count, tile_count_, shape.tiles);
  Put(h, o_head, head_rows_, shape.head_rows);
  Put(h, o_samples, sample_params_, shape.samples);
  Put(h, o_history, history_, history_.size());
  const std::vector<int32_t> counted = {real_tokens};
  Put(h, o_counted, counted, 1);
  Put(h, o_dispatch_first, dispatch_first_, shape.dispatch_segments);
  Put(h, o_dispatch_count, dispatch_count_, shape.dispatch_segments);
  if (carried_values > 0) {
    // Padding sequences open a group at position 0: their rows are never read.
    const size_t real_values = static_cast<size_t>(carried_rows_) * total_experts_;
    std::memset(h + o_carried, 0, carried_values * 4);
    if (carried != nullptr) std::memcpy(h + o_carried, carried, real_values * 4);
  }
  char* d = inputs_.as<char>();
  device_.token_ids = reinterpret_cast<const int32_t*>(d + o_tokens);
  device_.positions = reinterpret_cast<const int32_t*>(d + o_positions);
  device_.token_sequence = reinterpret_cast<const int32_t*>(d + o_sequence);
  device_.cache_rows = reinterpret_cast<const int64_t*>(d + o_rows);
  device_.block_tables = reinterpret_cast<const int32_t*>(d + o_tables);
  device_.block_offsets = reinterpret_cast<const int32_t*>(d + o_offsets);
  device_.tile_first = reinterpret_cast<const int32_t*>(d + o_first);
  device_.tile_count = reinterpret_cast<const int32_t*>(d + o_count);
  device_.head_rows = reinterpret_cast<const int32_t*>(d + o_head);
  device_.samples = reinterpret_cast<const DeviceSampleParams*>(d + o_samples);
  device_.history = reinterpret_cast<const int32_t*>(d + o_history);
  device_.counted_tokens = reinterpret_cast<const int32_t*>(d + o_counted);
  const bool sequence_scope = model_.capacity_group > 0;
  device_.dispatch_first =
      sequence_scope ? reinterpret_cast<const int32_t*>(d + o_dispatch_first) : nullptr;
  device_.dispatch_count =
      sequence_scope ? reinterpret_cast<const int32_t*>(d + o_dispatch_count) : nullptr;
  device_.carried_loads =
      carried_values > 0 ? reinterpret_cast<const int32_t*>(d + o_carried) : nullptr;

  // The results: samples, statistics, logits rows, traces.
  PackedLayout out;
  offset_sample_token_ = out.Add(shape.samples, 4);
  offset_sample_logprob_ = out.Add(shape.samples, 4);
  offset_top_ids_ = out.Add(static_cast<size_t>(shape.samples) * shape.max_logprobs, 4);
  offset_top_logprobs_ = out.Add(static_cast<size_t>(shape.samples) * shape.max_logprobs, 4);
  offset_prob_sum_ = out.Add(total_experts_, 8);
  offset_counts_ = out.Add(4 * total_experts_, 4);
  offset_carried_out_ = out.Add(carried_values, 4);  // before the logits: always downloaded
  offset_logits_ = out.Add(static_cast<size_t>(shape.head_rows) * model_.vocab, 4);
  const size_t assignments = static_cast<size_t>(shape.tokens) * total_choices_;
  offset_trace_expert_ = out.Add(assignments, 4);
  offset_trace_gate_ = out.Add(assignments, 4);
  offset_trace_fate_ = out.Add(assignments, 1);
  result_bytes_ = out.bytes();
  if (absl::Status s = results_buffer_.Grow(result_bytes_, &moved); !s.ok()) return s;
  epoch_ += moved ? 1 : 0;
  if (absl::Status s = results_host_.Grow(result_bytes_); !s.ok()) return s;
  char* r = results_buffer_.as<char>();
  results_.sample_token = reinterpret_cast<int32_t*>(r + offset_sample_token_);
  results_.sample_logprob = reinterpret_cast<float*>(r + offset_sample_logprob_);
  results_.top_ids = reinterpret_cast<int32_t*>(r + offset_top_ids_);
  results_.top_logprobs = reinterpret_cast<float*>(r + offset_top_logprobs_);
  results_.prob_sum = reinterpret_cast<double*>(r + offset_prob_sum_);
  results_.counts = reinterpret_cast<int32_t*>(r + offset_counts_);
  results_.logits = reinterpret_cast<float*>(r + offset_logits_);
  results_.trace_expert = reinterpret_cast<int32_t*>(r + offset_trace_expert_);
  results_.trace_gate = reinterpret_cast<float*>(r + offset_trace_gate_);
  results_.trace_fate = reinterpret_cast<uint8_t*>(r + offset_trace_fate_);
  results_.carried_out =
      carried_values > 0 ? reinterpret_cast<int32_t*>(r + offset_carried_out_) : nullptr;
  return absl::OkStatus();
}

void StepIo::CarriedOut(int32_t* carried) const {
  if (carried == nullptr || results_.carried_out == nullptr) return;
  std::memcpy(carried, results_host_.get() + offset_carried_out_,
              static_cast<size_t>(carried_rows_) * total_experts_ * 4);
}

int64_t StepIo::MaxSequenceScopeRows(int64_t capacity) const {
  if (model_.capacity_group == 0) return shape_.tokens;
  int64_t rows = 0;
  for (int32_t count : dispatch_count_) rows += std::min<int64_t>(count, capacity);
  return rows;
}

absl::Status StepIo::Upload(cudaStream_t stream) {
  SWITCHSERVE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(inputs_.get(), staging_.get(), upload_head_bytes_, cudaMemcpyHostToDevice,
                      stream),
      "step upload");
  if (upload_history_bytes_ == 0) return absl::OkStatus();
  return CudaStatus(cudaMemcpyAsync(inputs_.as<char>() + upload_history_offset_,
                                    staging_.get() + upload_history_offset_, upload_history_bytes_,
                                    cudaMemcpyHostToDevice, stream),
                    "step upload (histories)");
}

absl::Status StepIo::Download(cudaStream_t stream, bool traces) {
  downloaded_ =
      traces ? result_bytes_ : offset_logits_ + static_cast<size_t>(logit_rows_) * model_.vocab * 4;
  SWITCHSERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(results_host_.get(), results_buffer_.get(),
                                                   downloaded_, cudaMemcpyDeviceToHost, stream),
                                   "step download");
  return CudaStatus(cudaStreamSynchronize(stream), "step");
}

void StepIo::Fill(const StepBatch& batch, StepOutput* out) const {
  const char* h = results_host_.get();
  const RouterLayout& layout = *model_.layout;
  const int vocab = model_.vocab;
  const int T = real_tokens_;
  out->vocab_size = vocab;
  out->logits.assign(reinterpret_cast<const float*>(h + offset_logits_),
                     reinterpret_cast<const float*>(h + offset_logits_) +
                         static_cast<size_t>(logit_rows_) * vocab);
  out->row_sequence.clear();
  out->row_position.clear();
  for (int r = 0; r < logit_rows_; ++r) {
    out->row_sequence.push_back(batch.token_sequence[head_rows_[r]]);
    out->row_position.push_back(batch.positions[head_rows_[r]]);
  }

  // Statistics, router by router.
  out->stats.Reset(layout.routers());
  const double* prob = reinterpret_cast<const double*>(h + offset_prob_sum_);
  const int32_t* counts = reinterpret_cast<const int32_t*>(h + offset_counts_);
  for (size_t i = 0; i < layout.size(); ++i) {
    RouterStepStats& s = out->stats.routers[i];
    const int E = layout[i].n_experts;
    const int32_t* c = counts + 4 * expert_prefix_[i];
    s.tokens = T;
    for (int e = 0; e < E; ++e) {
      s.routed[e] = c[e];
      s.kept[e] = c[E + e];
      s.rerouted[e] = c[2 * E + e];
      s.dropped[e] = c[3 * E + e];
      s.prob_sum[e] = prob[expert_prefix_[i] + e];
    }
  }

  // One token's routing, RouterLayout order.
  auto routing_of = [&](int token, TokenRouting* routing) {
    const int32_t* expert = reinterpret_cast<const int32_t*>(h + offset_trace_expert_);
    const float* gate = reinterpret_cast<const float*>(h + offset_trace_gate_);
    const uint8_t* fate = reinterpret_cast<const uint8_t*>(h + offset_trace_fate_);
    routing->choices.reserve(layout.choices_per_token());
    for (size_t i = 0; i < layout.size(); ++i) {
      const int k = layout[i].top_k;
      const int64_t base =
          static_cast<int64_t>(shape_.tokens) * choice_prefix_[i] + static_cast<int64_t>(token) * k;
      for (int j = 0; j < k; ++j) {
        RouteChoice choice;
        choice.expert = expert[base + j];
        choice.gate = gate[base + j];
        choice.fate = static_cast<RouteFate>(fate[base + j]);
        routing->choices.push_back(choice);
      }
    }
  };

  out->samples.clear();
  const int32_t* token = reinterpret_cast<const int32_t*>(h + offset_sample_token_);
  const float* logprob = reinterpret_cast<const float*>(h + offset_sample_logprob_);
  const int32_t* top_ids = reinterpret_cast<const int32_t*>(h + offset_top_ids_);
  const float* top_logprobs = reinterpret_cast<const float*>(h + offset_top_logprobs_);
  for (size_t i = 0; i < pending_.size(); ++i) {
    const int s = pending_[i].sequence;
    const StepSequence& sequence = batch.sequences[s];
    SampledToken& sampled = out->samples.emplace_back();
    sampled.sequence = s;
    sampled.sample.token_id = token[i];
    // The device computes every sample's logprob; the host sampler reports
    // one only where it was asked for, and so does this backend.
    if (sequence.sample.params->WantsLogprob()) sampled.sample.logprob = logprob[i];
    const int n = std::min(sequence.sample.params->logprobs, vocab);
    for (int j = 0; j < n; ++j) {
      const size_t at = i * static_cast<size_t>(shape_.max_logprobs) + j;
      sampled.sample.top_logprobs.emplace_back(top_ids[at], top_logprobs[at]);
    }
    if (sequence.collect_routing) routing_of(batch.token_offsets[s + 1] - 1, &sampled.routing);
  }

  out->routing.clear();
  if (collect_) {
    out->routing.resize(logit_rows_);
    for (int r = 0; r < logit_rows_; ++r) {
      if (batch.sequences[out->row_sequence[r]].collect_routing) {
        routing_of(head_rows_[r], &out->routing[r]);
      }
    }
  }
}

}  // namespace switchserve::cuda
