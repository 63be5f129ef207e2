#include "kernels/cpu/cpu_backend.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <new>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/model/host_cpus.h"
#include "engine/model/host_memory.h"
#include "engine/model/huge_pages.h"
#include "engine/runtime/kv_cache.h"
#include "kernels/cpu/cpu_attention.h"
#include "kernels/cpu/cpu_ffn.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/cpu_step.h"
#include "kernels/cpu/cpu_xl_positions.h"
#include "kernels/cpu/matmul_runner.h"

namespace switchserve {
namespace {

class CpuBackend final : public Backend {
 public:
  CpuBackend(const ModelConfig& config, const ModelWeights& weights, const DispatchConfig& dispatch,
             const CpuBackendOptions& options, cpu::XlPositionTable positions)
      : config_(config),
        weights_(weights),
        positions_(std::move(positions)),
        kv_dtype_(options.kv_cache_dtype),
        num_threads_(options.num_threads > 0
                         ? options.num_threads
                         : std::min(omp_get_max_threads(), AvailableCpus().count)),
        isa_(options.kernel_isa.value_or(cpu::BestKernelIsa())),
        pool_(num_threads_),
        runner_(isa_, &pool_, options.parallel_matmul_min_macs),
        parallel_sampling_min_vocab_(options.parallel_sampling_min_vocab),
        want_copies_(options.one_row_weights),
        host_memory_bytes_(options.host_memory_bytes > 0 ? options.host_memory_bytes
                                                         : HostMemoryBytes()),
        resident_bytes_(options.resident_bytes >= 0     ? options.resident_bytes
                        : options.host_memory_bytes > 0 ? 0
                                                        : -1),
        attention_(config, dispatch, isa_, &runner_, &pool_, &one_row_,
                   options.parallel_attention_min_macs),
        ffn_(config, dispatch, &runner_, &pool_, &one_row_),
        dispatch_(dispatch),
        layout_(config) {
    // Our kernels share the cores out (the worker pool). OpenBLAS, unused on
    // the step's path, runs what it is given on the calling thread, so that
    // its own pool (started as the library loads) sleeps from then on.
    openblas_set_num_threads(1);
  }

  std::string_view name() const override { return "cpu"; }
  std::string_view kernels() const override { return ToString(isa_); }
  int compute_threads() const override { return num_threads_; }

  absl::Status InitKvCache(int64_t num_blocks, int block_size) override {
    if (num_blocks <= 0 || block_size <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("KV cache: num_blocks (", num_blocks,
                                                     ") and block_size (", block_size,
                                                     ") must be positive"));
    }
    const AttentionConfig& attn = config_.attention;
    const int64_t rows = num_blocks * block_size;
    const int64_t krow = static_cast<int64_t>(attn.n_kv_heads) * attn.head_dim;
    const int64_t vrow = krow * attn.CachedValuesPerKvHead();
    // The cache lives in host memory beside the weights and the position
    // tables, and the process needs some of its own: refuse what cannot fit
    // rather than count on the allocator (with overcommit, zero-filling it
    // would, and end in the OOM killer; so would a cache that filled the
    // whole host, at the server's first allocations).
    const int64_t kv_bytes = SaturatingMul(KvBytesPerToken(), rows);
    const int64_t held = SaturatingAdd(weights_.Bytes(), TableBytes());
    if (SaturatingAdd(InUse(held), kv_bytes) > HostMemoryBudget(host_memory_bytes_)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "KV cache of ", rows, " tokens needs ",
          kv_bytes == std::numeric_limits<int64_t>::max() ? std::string("more than 2^63")
                                                          : absl::StrCat(kv_bytes),
          " bytes beside the ", InUse(held), " bytes the process holds (", held,
          " of weights and position tables), more than 90% of this host's memory (",
          host_memory_bytes_, " bytes; the rest is the process's own)"));
    }
    const int64_t element = DTypeSize(kv_dtype_);
    k_cache_.assign(config_.n_layers, HugePageVector<float>());
    v_cache_.assign(config_.n_layers, HugePageVector<float>());
    try {
      for (int l = 0; l < config_.n_layers; ++l) {  // whole floats of the cache's elements
        k_cache_[l].assign((rows * krow * element + 3) / 4, 0.0f);
        v_cache_[l].assign((rows * vrow * element + 3) / 4, 0.0f);
      }
    } catch (const std::bad_alloc&) {
      k_cache_.clear();
      v_cache_.clear();
      num_blocks_ = 0;
      block_size_ = 0;
      return absl::ResourceExhaustedError(absl::StrCat("KV cache: cannot allocate ", num_blocks,
                                                       " blocks of ", block_size, " tokens (",
                                                       KvBytesPerToken() * rows, " bytes)"));
    }
    num_blocks_ = num_blocks;
    block_size_ = block_size;
    MakeWeightCopies(KvBytesPerToken() * rows);
    return absl::OkStatus();
  }

  DType kv_cache_dtype() const override { return kv_dtype_; }
  WeightCopies weight_copies() const override {
    return {one_row_.bytes(), skipped_copy_bytes_,
            want_copies_ ? HostMemoryBudget(host_memory_bytes_) : 0};
  }
  int64_t KvBytesPerToken() const override {
    return switchserve::KvBytesPerToken(config_, DTypeSize(kv_dtype_));
  }

  absl::Status Forward(const StepBatch& batch, StepOutput* out) override;

 private:
  // The bytes of the XL position tables (none without XL positions).
  int64_t TableBytes() const {
    return positions_.empty() ? 0 : std::max<int64_t>(0, cpu::XlPositionTable::BytesFor(config_));
  }

  // What the process holds with the backend's `held` bytes: on the whole
  // host, all it has resident when that is more (its libraries, the
  // runtime's buffers: in a 256 MiB container a KV cache that fitted beside
  // the weights alone ended the server in the OOM killer at start-up).
  int64_t InUse(int64_t held) const {
    return std::max(held, resident_bytes_ >= 0 ? resident_bytes_ : ResidentBytes());
  }

  // The tiled copies for one-row products (CpuBackendOptions::one_row_weights)
  // where they fit beside what the backend holds and the KV cache of
  // `kv_bytes`, in HostMemoryBudget of the host's memory; else none.
  void MakeWeightCopies(int64_t kv_bytes) {
    one_row_ = cpu::OneRowWeights();
    skipped_copy_bytes_ = 0;
    if (!want_copies_) return;
    const cpu::MatmulKernels& kernels = cpu::KernelsFor(isa_);
    const int64_t copies = cpu::OneRowWeights::BytesFor(config_, weights_, kernels);
    const int64_t held = SaturatingAdd(SaturatingAdd(weights_.Bytes(), kv_bytes), TableBytes());
    if (SaturatingAdd(InUse(held), copies) <= HostMemoryBudget(host_memory_bytes_)) {
      one_row_ = cpu::OneRowWeights(config_, weights_, kernels);
    } else {
      skipped_copy_bytes_ = copies;
    }
  }

  // logits[r] = the output head's logits of the token at step row rows[r].
  void OutputHead(const std::vector<int>& rows, float* logits);
  // Appends the recorded routing of step token `token` (RouterLayout order).
  void AppendRouting(int token, TokenRouting* routing) const;

  const ModelConfig config_;
  const ModelWeights& weights_;
  const cpu::XlPositionTable positions_;  // empty with RoPE
  const DType kv_dtype_;                  // of the KV cache: f32 or bf16
  int num_threads_;
  cpu::KernelIsa isa_;
  cpu::WorkerPool pool_;
  cpu::MatmulRunner runner_;
  const int parallel_sampling_min_vocab_;  // CpuBackendOptions'
  const bool want_copies_;                 // CpuBackendOptions::one_row_weights
  const int64_t host_memory_bytes_;        // that the copies must fit in
  const int64_t resident_bytes_;           // CpuBackendOptions::resident_bytes; -1: measured
  cpu::OneRowWeights one_row_;             // made by InitKvCache
  int64_t skipped_copy_bytes_ = 0;
  cpu::CpuAttention attention_;
  cpu::CpuFfn ffn_;
  DispatchConfig dispatch_;
  RouterLayout layout_;
  StepGroupLoads group_loads_;

  int64_t num_blocks_ = 0;
  int block_size_ = 0;
  // Per layer; storage for elements of kv_dtype_ (two bf16 per float). On
  // huge pages, as the weights are: a batch's decode step streams it.
  std::vector<HugePageVector<float>> k_cache_;
  std::vector<HugePageVector<float>> v_cache_;

  // Per-step scratch, reused.
  std::vector<float> x_;              // [T, d] residual stream
  std::vector<float> xn_;             // [T, d] normed
  std::vector<int> logit_rows_;       // step rows returning logits
  std::vector<int> sample_rows_;      // step rows only sampled from
  std::vector<float> sample_logits_;  // [sample rows, vocab]
  struct PendingSample {
    int sequence;
    bool from_logits;  // its last token's logits are a row of StepOutput::logits
    int row;           // that row, or the row of sample_logits_
  };
  std::vector<PendingSample> samples_;
  std::vector<std::vector<RouteChoice>> traces_;
};

absl::Status CpuBackend::Forward(const StepBatch& batch, StepOutput* out) {
  if (block_size_ == 0) return absl::FailedPreconditionError("Forward before InitKvCache");
  if (absl::Status s = ValidateStepBatch(batch, config_.vocab_size, config_.max_seq_len,
                                         num_blocks_, block_size_);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = group_loads_.Gather(batch, dispatch_, layout_.total_experts()); !s.ok()) {
    return s;
  }
  const int T = batch.num_tokens();
  const int S = batch.num_sequences();
  const int d = config_.d_model;
  const int vocab = config_.vocab_size;
  const float eps = static_cast<float>(config_.norm_eps);

  out->Clear(vocab, layout_.routers());

  bool collect = false;
  for (const StepSequence& sequence : batch.sequences) collect |= sequence.collect_routing;
  cpu::RoutingRecorder recorder;
  recorder.stats = &out->stats;
  recorder.token_sequence = batch.token_sequence.data();
  recorder.positions = batch.positions.data();
  recorder.group_loads = group_loads_.rows();
  recorder.loads_width = group_loads_.width();
  recorder.layout = &layout_;
  if (collect) {
    traces_.resize(layout_.size());
    recorder.traces = &traces_;
  }
  if (T == 0) return absl::OkStatus();

  cpu::Grow(x_, static_cast<size_t>(T) * d);
  cpu::Grow(xn_, static_cast<size_t>(T) * d);
  for (int t = 0; t < T; ++t) {
    cpu::WidenValues(weights_.embedding, static_cast<int64_t>(batch.token_ids[t]) * d, d,
                     x_.data() + static_cast<int64_t>(t) * d);
  }

  // A norm's value took about as long as 64 multiply-adds of a matmul
  // kernel when rows went one at a time: its sums are chains of dependent
  // double-precision adds, against 16 fused multiply-adds a cycle. Rows now
  // go four at a time, their chains overlapping, so this shares norms of a
  // few rows out earlier than their cost alone would ask.
  const int64_t norm_parallel_min_values = runner_.parallel_min_macs() / 64;
  for (int l = 0; l < config_.n_layers; ++l) {
    const LayerWeights& lw = weights_.layers[l];
    cpu::NormRows(config_.norm, eps, x_.data(), T, d, lw.attn_norm_w.f32(),
                  cpu::F32OrNull(lw.attn_norm_b), xn_.data(), &pool_, norm_parallel_min_values);
    attention_.Run(lw.attn, batch, xn_.data(), x_.data(),
                   cpu::KvLayerCache{kv_dtype_, k_cache_[l].data(), v_cache_[l].data()},
                   positions_.Layer(l), layout_.AttentionBase(l), recorder);
    cpu::NormRows(config_.norm, eps, x_.data(), T, d, lw.ffn_norm_w.f32(),
                  cpu::F32OrNull(lw.ffn_norm_b), xn_.data(), &pool_, norm_parallel_min_values);
    ffn_.Run(lw.ffn, T, xn_.data(), x_.data(), layout_.FfnRouter(l), recorder);
  }
  group_loads_.Commit(batch);

  // The output head runs on the rows that return logits (in step order) and
  // on the last token of each sampling sequence that returns none.
  logit_rows_.clear();
  sample_rows_.clear();
  samples_.clear();
  for (int s = 0; s < S; ++s) {
    const StepSequence& sequence = batch.sequences[s];
    const int begin = batch.token_offsets[s], end = batch.token_offsets[s + 1];
    if (sequence.logits == LogitsMode::kAll) {
      for (int t = begin; t < end; ++t) logit_rows_.push_back(t);
    } else if (sequence.logits == LogitsMode::kLast) {
      logit_rows_.push_back(end - 1);
    }
    if (sequence.sample.params == nullptr) continue;
    if (sequence.logits != LogitsMode::kNone) {
      samples_.push_back({s, /*from_logits=*/true, static_cast<int>(logit_rows_.size()) - 1});
    } else {
      sample_rows_.push_back(end - 1);
      samples_.push_back({s, /*from_logits=*/false, static_cast<int>(sample_rows_.size()) - 1});
    }
  }
  for (int t : logit_rows_) {
    out->row_sequence.push_back(batch.token_sequence[t]);
    out->row_position.push_back(batch.positions[t]);
  }
  out->logits.resize(logit_rows_.size() * vocab);
  OutputHead(logit_rows_, out->logits.data());
  cpu::Grow(sample_logits_, sample_rows_.size() * vocab);
  OutputHead(sample_rows_, sample_logits_.data());

  // The host sampler, on the last token's logits: each sample on its own
  // (its request's generator, its row), so sharing them out over the
  // threads changes nothing in what they draw.
  const size_t first_sample = out->samples.size();
  out->samples.resize(first_sample + samples_.size());
  auto sample = [&](int i, int /*slot*/) {
    const PendingSample& pending = samples_[i];
    const float* logits = (pending.from_logits ? out->logits.data() : sample_logits_.data()) +
                          static_cast<int64_t>(pending.row) * vocab;
    const SampleRequest& request = batch.sequences[pending.sequence].sample;
    SampledToken& sampled = out->samples[first_sample + i];
    sampled.sequence = pending.sequence;
    sampled.sample =
        SampleToken(absl::MakeConstSpan(logits, vocab), *request.params, request.history,
                    request.prompt_length, request.params->logprobs, *request.rng);
  };
  const int num_samples = static_cast<int>(samples_.size());
  if (num_samples >= 2 && vocab >= parallel_sampling_min_vocab_) {
    pool_.Run(num_samples, sample);
  } else {
    for (int i = 0; i < num_samples; ++i) sample(i, 0);
  }
  // The engine's work until the next step runs on this thread alone.
  pool_.Rest();
  for (int i = 0; i < num_samples; ++i) {
    const int s = samples_[i].sequence;
    if (batch.sequences[s].collect_routing) {
      AppendRouting(batch.token_offsets[s + 1] - 1, &out->samples[first_sample + i].routing);
    }
  }

  if (collect) {
    out->routing.resize(logit_rows_.size());
    for (size_t r = 0; r < logit_rows_.size(); ++r) {
      if (batch.sequences[out->row_sequence[r]].collect_routing) {
        AppendRouting(logit_rows_[r], &out->routing[r]);
      }
    }
  }
  return absl::OkStatus();
}

void CpuBackend::OutputHead(const std::vector<int>& rows, float* logits) {
  const int d = config_.d_model;
  const int n = static_cast<int>(rows.size());
  if (n == 0) return;
  for (int r = 0; r < n; ++r) {
    cpu::NormRows(config_.norm, static_cast<float>(config_.norm_eps),
                  x_.data() + static_cast<int64_t>(rows[r]) * d, 1, d, weights_.final_norm_w.f32(),
                  cpu::F32OrNull(weights_.final_norm_b), xn_.data() + static_cast<int64_t>(r) * d);
  }
  const int vocab = config_.vocab_size;
  runner_.Run(cpu::WeightLayout::kRowsOut,
              {n, vocab, d, xn_.data(), d, nullptr, one_row_.Matrix(weights_.OutputHead(), d, 0, n),
               logits, vocab},
              {cpu::F32OrNull(weights_.lm_head_bias)});
}

void CpuBackend::AppendRouting(int token, TokenRouting* routing) const {
  std::vector<RouteChoice>& choices = routing->choices;
  choices.reserve(layout_.choices_per_token());
  for (size_t i = 0; i < layout_.size(); ++i) {
    const int k = layout_[i].top_k;
    const RouteChoice* first = traces_[i].data() + static_cast<int64_t>(token) * k;
    choices.insert(choices.end(), first, first + k);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackend(const ModelConfig& config,
                                                          const ModelWeights& weights,
                                                          const DispatchConfig& dispatch,
                                                          const CpuBackendOptions& options) {
  if (options.kv_cache_dtype != DType::kF32 && options.kv_cache_dtype != DType::kBF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("the CPU backend's KV cache holds f32 or bf16, not ",
                     std::string(ToString(options.kv_cache_dtype))));
  }
  if (options.kernel_isa.has_value() && !cpu::CpuSupports(*options.kernel_isa)) {
    std::vector<std::string> supported;
    for (cpu::KernelIsa isa : cpu::SupportedKernelIsas()) supported.emplace_back(ToString(isa));
    return absl::InvalidArgumentError(
        absl::StrCat("this CPU cannot run the ", std::string(ToString(*options.kernel_isa)),
                     " kernels; it runs: ", absl::StrJoin(supported, ", ")));
  }
  int64_t max_table_bytes = options.max_position_table_bytes;
  if (max_table_bytes <= 0) {
    // The ceiling the KV cache and the weights are checked against.
    const int64_t bytes = cpu::XlPositionTable::BytesFor(config);
    if (absl::Status fits = CheckFitsInHostMemory(
            bytes < 0 ? std::numeric_limits<int64_t>::max() : bytes,
            absl::StrCat("the XL position tables (n_layers ", config.n_layers, " x n_heads ",
                         config.attention.n_heads, " x max_seq_len ", config.max_seq_len,
                         " x head_dim ", config.attention.head_dim, " floats)"));
        !fits.ok()) {
      return fits;
    }
    max_table_bytes = std::numeric_limits<int64_t>::max();
  }
  absl::StatusOr<cpu::XlPositionTable> positions =
      cpu::XlPositionTable::Create(config, weights, max_table_bytes);
  if (!positions.ok()) return positions.status();
  return std::make_unique<CpuBackend>(config, weights, dispatch, options, *std::move(positions));
}

}  // namespace switchserve
