#include "kernels/cpu/cpu_backend.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <new>

#include "absl/strings/str_cat.h"
#include "engine/runtime/kv_cache.h"
#include "kernels/cpu/cpu_attention.h"
#include "kernels/cpu/cpu_ffn.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/cpu_step.h"

namespace switchserve {
namespace {

class CpuBackend final : public Backend {
 public:
  CpuBackend(const ModelConfig& config, const ModelWeights& weights, const DispatchConfig& dispatch,
             const CpuBackendOptions& options)
      : config_(config),
        weights_(weights),
        num_threads_(options.num_threads > 0 ? options.num_threads : omp_get_max_threads()),
        attention_(config, dispatch, num_threads_, options.parallel_attention_min_macs),
        ffn_(config, dispatch),
        layout_(config) {
    if (options.num_threads > 0) openblas_set_num_threads(options.num_threads);
  }

  std::string_view name() const override { return "cpu"; }

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
    k_cache_.assign(config_.n_layers, std::vector<float>());
    v_cache_.assign(config_.n_layers, std::vector<float>());
    try {
      for (int l = 0; l < config_.n_layers; ++l) {
        k_cache_[l].assign(rows * krow, 0.0f);
        v_cache_[l].assign(rows * vrow, 0.0f);
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
    return absl::OkStatus();
  }

  int64_t KvBytesPerToken() const override {
    return switchserve::KvBytesPerToken(config_, sizeof(float));
  }

  absl::Status Forward(const StepInput& input, StepOutput* out) override;

 private:
  absl::Status Validate(const StepInput& input) const;
  void BuildLayout(const StepInput& input);

  const ModelConfig config_;
  const ModelWeights& weights_;
  int num_threads_;
  cpu::CpuAttention attention_;
  cpu::CpuFfn ffn_;
  RouterLayout layout_;

  int64_t num_blocks_ = 0;
  int block_size_ = 0;
  std::vector<std::vector<float>> k_cache_;  // per layer
  std::vector<std::vector<float>> v_cache_;  // per layer

  // Per-step scratch, reused.
  cpu::StepLayout step_;
  std::vector<float> x_;   // [T, d] residual stream
  std::vector<float> xn_;  // [T, d] normed
  std::vector<int32_t> rows_;
  std::vector<std::vector<RouteChoice>> traces_;
};

absl::Status CpuBackend::Validate(const StepInput& input) const {
  if (block_size_ == 0) return absl::FailedPreconditionError("Forward before InitKvCache");
  for (size_t c = 0; c < input.chunks.size(); ++c) {
    const SequenceChunk& chunk = input.chunks[c];
    // Built only on the error path: validation allocates nothing on success.
    auto where = [c] { return absl::StrCat("chunks[", c, "]"); };
    if (chunk.tokens.empty()) return absl::InvalidArgumentError(where() + ".tokens: empty");
    for (size_t i = 0; i < chunk.tokens.size(); ++i) {
      if (chunk.tokens[i] < 0 || chunk.tokens[i] >= config_.vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrCat(where(), ".tokens[", i, "]: ", chunk.tokens[i], " outside vocabulary [0, ",
                         config_.vocab_size, ")"));
      }
    }
    const int64_t end = static_cast<int64_t>(chunk.start_pos) + chunk.tokens.size();
    if (chunk.start_pos < 0 || end > config_.max_seq_len) {
      return absl::InvalidArgumentError(absl::StrCat(where(), ": positions [", chunk.start_pos,
                                                     ", ", end, ") outside [0, max_seq_len ",
                                                     config_.max_seq_len, ")"));
    }
    if (chunk.block_table == nullptr) {
      return absl::InvalidArgumentError(where() + ".block_table: missing");
    }
    const int64_t needed = (end + block_size_ - 1) / block_size_;
    if (static_cast<int64_t>(chunk.block_table->size()) < needed) {
      return absl::InvalidArgumentError(
          absl::StrCat(where(), ".block_table: ", chunk.block_table->size(),
                       " blocks, positions up to ", end, " need ", needed));
    }
    for (int64_t b = 0; b < needed; ++b) {
      const int32_t id = (*chunk.block_table)[b];
      if (id < 0 || id >= num_blocks_) {
        return absl::InvalidArgumentError(absl::StrCat(where(), ".block_table[", b, "]: block ", id,
                                                       " outside [0, ", num_blocks_, ")"));
      }
    }
  }
  return absl::OkStatus();
}

void CpuBackend::BuildLayout(const StepInput& input) {
  step_.tokens = 0;
  step_.block_size = block_size_;
  step_.position.clear();
  step_.chunk.clear();
  step_.cache_row.clear();
  step_.block_table.clear();
  for (size_t c = 0; c < input.chunks.size(); ++c) {
    const SequenceChunk& chunk = input.chunks[c];
    step_.block_table.push_back(chunk.block_table);
    for (size_t i = 0; i < chunk.tokens.size(); ++i) {
      const int pos = chunk.start_pos + static_cast<int>(i);
      step_.position.push_back(pos);
      step_.chunk.push_back(static_cast<int32_t>(c));
      step_.cache_row.push_back(step_.CacheRow(static_cast<int>(c), pos));
    }
  }
  step_.tokens = static_cast<int>(step_.position.size());
}

absl::Status CpuBackend::Forward(const StepInput& input, StepOutput* out) {
  if (absl::Status s = Validate(input); !s.ok()) return s;
  BuildLayout(input);
  const int T = step_.tokens;
  const int d = config_.d_model;
  const float eps = static_cast<float>(config_.norm_eps);

  out->vocab_size = config_.vocab_size;
  out->logits.clear();
  out->row_chunk.clear();
  out->row_position.clear();
  out->routing.clear();
  out->stats.Reset(layout_.routers());

  bool collect = false;
  for (const SequenceChunk& chunk : input.chunks) collect = collect || chunk.collect_routing;
  cpu::RoutingRecorder recorder;
  recorder.stats = &out->stats;
  if (collect) {
    traces_.resize(layout_.size());
    recorder.traces = &traces_;
  }
  if (T == 0) return absl::OkStatus();

  cpu::Grow(x_, static_cast<size_t>(T) * d);
  cpu::Grow(xn_, static_cast<size_t>(T) * d);
  int t = 0;
  for (const SequenceChunk& chunk : input.chunks) {
    for (int32_t token : chunk.tokens) {
      std::memcpy(x_.data() + static_cast<int64_t>(t++) * d,
                  weights_.embedding.ptr() + static_cast<int64_t>(token) * d, d * sizeof(float));
    }
  }

  for (int l = 0; l < config_.n_layers; ++l) {
    const LayerWeights& lw = weights_.layers[l];
    cpu::NormRows(config_.norm, eps, x_.data(), T, d, lw.attn_norm_w.ptr(),
                  cpu::OrNull(lw.attn_norm_b), xn_.data());
    attention_.Run(lw.attn, step_, xn_.data(), x_.data(), k_cache_[l].data(), v_cache_[l].data(),
                   layout_.AttentionBase(l), recorder);
    cpu::NormRows(config_.norm, eps, x_.data(), T, d, lw.ffn_norm_w.ptr(),
                  cpu::OrNull(lw.ffn_norm_b), xn_.data());
    ffn_.Run(lw.ffn, T, xn_.data(), x_.data(), layout_.FfnRouter(l), recorder);
  }

  // Rows that return logits, in step order.
  rows_.clear();
  t = 0;
  for (size_t c = 0; c < input.chunks.size(); ++c) {
    const SequenceChunk& chunk = input.chunks[c];
    const int n = static_cast<int>(chunk.tokens.size());
    for (int i = 0; i < n; ++i, ++t) {
      if (chunk.logits == LogitsMode::kAll || (chunk.logits == LogitsMode::kLast && i == n - 1)) {
        rows_.push_back(t);
        out->row_chunk.push_back(static_cast<int32_t>(c));
        out->row_position.push_back(step_.position[t]);
      }
    }
  }
  const int rows = static_cast<int>(rows_.size());
  for (int r = 0; r < rows; ++r) {
    cpu::NormRows(config_.norm, eps, x_.data() + static_cast<int64_t>(rows_[r]) * d, 1, d,
                  weights_.final_norm_w.ptr(), cpu::OrNull(weights_.final_norm_b),
                  xn_.data() + static_cast<int64_t>(r) * d);
  }
  out->logits.resize(static_cast<size_t>(rows) * config_.vocab_size);
  cpu::GemmNT(rows, config_.vocab_size, d, 1.0f, xn_.data(), d, weights_.OutputHead().ptr(), d,
              0.0f, out->logits.data(), config_.vocab_size);

  if (collect) {
    out->routing.resize(rows);
    for (int r = 0; r < rows; ++r) {
      if (!input.chunks[out->row_chunk[r]].collect_routing) continue;
      std::vector<RouteChoice>& choices = out->routing[r].choices;
      choices.reserve(layout_.choices_per_token());
      for (size_t i = 0; i < layout_.size(); ++i) {
        const int k = layout_[i].top_k;
        const RouteChoice* first = traces_[i].data() + static_cast<int64_t>(rows_[r]) * k;
        choices.insert(choices.end(), first, first + k);
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::unique_ptr<Backend> CreateCpuBackend(const ModelConfig& config, const ModelWeights& weights,
                                          const DispatchConfig& dispatch,
                                          const CpuBackendOptions& options) {
  return std::make_unique<CpuBackend>(config, weights, dispatch, options);
}

}  // namespace switchserve
