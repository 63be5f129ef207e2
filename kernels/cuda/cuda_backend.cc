#include "kernels/cuda/cuda_backend.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/moe/router_layout.h"
#include "engine/runtime/kv_cache.h"
#include "kernels/cuda/attention.h"
#include "kernels/cuda/cuda_backend_impl.h"
#include "kernels/cuda/dependent_launch.h"
#include "kernels/cuda/dispatch_plan.h"
#include "kernels/cuda/linear.h"
#include "kernels/cuda/norm.h"
#include "kernels/cuda/sampling.h"
#include "kernels/cuda/xl_positions.h"

namespace switchserve {

bool CudaBackendIsEmulated() {
#if defined(SWITCHSERVE_SIMT_EMULATION)
  return true;
#else
  return false;
#endif
}

std::string DescribeCudaDevices() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    cudaGetLastError();
    return absl::StrCat("no usable CUDA device: cudaGetDeviceCount: ", cudaGetErrorName(error),
                        " (", cudaGetErrorString(error), ")");
  }
  if (count == 0) return "no CUDA device";
  std::string out = absl::StrCat(count, " device(s):");
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    absl::StrAppend(&out, i == 0 ? " " : ", ", prop.name, " (sm_", prop.major, prop.minor, ", ",
                    prop.totalGlobalMem >> 30, " GiB)");
  }
  return out;
}

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const ModelConfig& config,
                                                           const ModelWeights& weights,
                                                           const DispatchConfig& dispatch,
                                                           const CudaBackendOptions& options) {
  return cuda::CudaBackend::Create(config, weights, dispatch, options);
}

namespace cuda {
namespace {

// Keys per attention segment by default. A decode step's attention runs one
// block per segment and KV head: at context 2000 on an H100, 128-key segments
// decode 1.6x faster than 512-key ones at batch 1 and 1.3x at batch 8
// (docs/performance.md).
constexpr int kDefaultSegmentTokens = 128;

// Steps of up to this many tokens launch their kernels as dependent launches
// (dependent_launch.h), which overlap each launch with the tail of the kernel
// before it. On an H100 that made SwitchAll decode 7% faster at batch 1 and 5%
// at batch 8, changed nothing at 64, and cost 1.5% (SwitchAll) and 16% (the
// dense baseline) at 256 (docs/performance.md). The bits are the same.
constexpr int kDependentLaunchMaxTokens = 8;

// The CPU backend's RoPE table (cpu::RopeTable), same arithmetic: angles in
// double, cos/sin rounded to f32.
void RopeTables(int64_t max_positions, int n_rot, double base, std::vector<float>* cos_table,
                std::vector<float>* sin_table) {
  const int half = n_rot / 2;
  cos_table->assign(static_cast<size_t>(std::max<int64_t>(1, max_positions * half)), 0.0f);
  sin_table->assign(cos_table->size(), 0.0f);
  for (int64_t p = 0; p < max_positions; ++p) {
    for (int i = 0; i < half; ++i) {
      const double inv_freq = std::pow(base, -2.0 * i / n_rot);
      const double angle = static_cast<double>(p) * inv_freq;
      (*cos_table)[static_cast<size_t>(p) * half + i] = static_cast<float>(std::cos(angle));
      (*sin_table)[static_cast<size_t>(p) * half + i] = static_cast<float>(std::sin(angle));
    }
  }
}

// A KV block's attention stages the whole block in shared memory
// (attention.h), so the block size is bounded by the device: refuse one whose
// attention could never launch, rather than fail every step.
// The attention's shape for the model's heads and KV blocks of `block_size`.
AttentionShape AttentionShapeOf(const AttentionConfig& attn, int block_size) {
  AttentionShape shape;
  shape.heads = attn.n_heads;
  shape.kv_heads = attn.n_kv_heads;
  shape.head_dim = attn.head_dim;
  shape.values_per_kv_head = attn.CachedValuesPerKvHead();
  shape.block_size = block_size;
  return shape;
}

// The dynamic shared memory a thread block may opt in to on `device`.
absl::StatusOr<int> OptInSharedBytes(int device) {
  int limit = 0;
  SWITCHSERVE_CUDA_RETURN_IF_ERROR(
      cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device),
      "cudaDeviceGetAttribute");
  return limit;
}

absl::Status CheckKvBlockFitsAttention(const AttentionConfig& attn, int device, int block_size) {
  if (block_size < 1) return absl::OkStatus();  // InitKvCache refuses it
  absl::StatusOr<int> opt_in = OptInSharedBytes(device);
  if (!opt_in.ok()) return opt_in.status();
  const int limit = *opt_in;
  const AttentionShape shape = AttentionShapeOf(attn, block_size);
  const size_t needed = AttentionSharedBytes(shape, 1);
  if (needed <= static_cast<size_t>(limit)) return absl::OkStatus();
  const int largest = AttentionMaxBlockSize(shape, limit);
  return absl::InvalidArgumentError(absl::StrCat(
      "--kv-block-size ", block_size, ": the CUDA backend's attention over a KV block of ",
      block_size, " tokens needs ", needed,
      " bytes of shared memory per thread block, more than this device's ", limit,
      " (cudaDevAttrMaxSharedMemoryPerBlockOptin); ",
      largest > 0 ? absl::StrCat("the largest block size that fits this model is ", largest)
                  : std::string("no block size fits this model")));
}

// Router top-k and capacity dispatch hold all of a router's experts in one
// thread block's shared memory (route_topk.h, dispatch_plan.h): refuse a model
// with more than the device holds, rather than fail every step.
absl::Status CheckRoutersFitSharedMemory(const ModelConfig& config, int device) {
  const RouterLayout layout(config);
  if (layout.empty()) return absl::OkStatus();
  absl::StatusOr<int> opt_in = OptInSharedBytes(device);
  if (!opt_in.ok()) return opt_in.status();
  const int limit = *opt_in;
  const auto fits = [limit](int experts, int top_k) {
    return DispatchPlanSharedBytes(experts) <= static_cast<size_t>(limit) &&
           RouteTopKSharedBytes(experts, top_k) <= static_cast<size_t>(limit);
  };
  for (const RouterId& router : layout.routers()) {
    if (fits(router.n_experts, router.top_k)) continue;
    // Both grow by at least 4 bytes an expert: bisect below limit / 4 + 1.
    int most = 0, fails = limit / 4 + 1;
    while (fails - most > 1) {
      const int mid = most + (fails - most) / 2;
      if (fits(mid, router.top_k)) {
        most = mid;
      } else {
        fails = mid;
      }
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "the CUDA backend routes at most ", most, " experts per router (top_k ", router.top_k,
        ") on this device, whose thread blocks have ", limit,
        " bytes of shared memory (cudaDevAttrMaxSharedMemoryPerBlockOptin); the model's ",
        std::string(ToString(router.module)), " router has ", router.n_experts, " experts"));
  }
  return absl::OkStatus();
}

NormType Norm(NormKind kind) {
  return kind == NormKind::kLayerNorm ? NormType::kLayer : NormType::kRms;
}

}  // namespace

CudaBackend::CudaBackend(const ModelConfig& config, const DispatchConfig& dispatch,
                         const CudaBackendOptions& options)
    : config_(config),
      dispatch_(dispatch),
      options_(options),
      layout_(config),
      name_(CudaBackendIsEmulated() ? "cuda (emulated)" : "cuda"),
      sixteen_bit_(options.sixteen_bit_weights) {}

CudaBackend::~CudaBackend() {
  if (stream_ != nullptr) {
    cudaStreamSynchronize(stream_);
    cudaStreamDestroy(stream_);
  }
}

absl::StatusOr<std::unique_ptr<Backend>> CudaBackend::Create(const ModelConfig& config,
                                                             const ModelWeights& weights,
                                                             const DispatchConfig& dispatch,
                                                             const CudaBackendOptions& options) {
  int count = 0;
  const cudaError_t counted = cudaGetDeviceCount(&count);
  cudaGetLastError();
  if (counted != cudaSuccess || count == 0) {
    return absl::FailedPreconditionError(DescribeCudaDevices());
  }
  if (options.device < 0 || options.device >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat("no usable CUDA device ", options.device, ": ", DescribeCudaDevices()));
  }
  SWITCHSERVE_CUDA_RETURN_IF_ERROR(cudaSetDevice(options.device), "cudaSetDevice");
  const AttentionConfig& attn = config.attention;
  if (attn.head_dim > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("the CUDA backend supports head_dim up to 256, found ", attn.head_dim));
  }
  if (absl::Status s = CheckRoutersFitSharedMemory(config, options.device); !s.ok()) return s;
  // The expert products put a head's experts, all heads', on the grid's z.
  constexpr int64_t kMaxGridZ = 65535;
  if (attn.IsRouted() && int64_t{attn.n_heads} * attn.n_experts > kMaxGridZ) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the CUDA backend's attention expert products launch n_heads x n_experts <= ", kMaxGridZ,
        " matrices (the grid's z); the model has ", attn.n_heads, " x ", attn.n_experts));
  }
  std::unique_ptr<CudaBackend> backend(new CudaBackend(config, dispatch, options));
  SWITCHSERVE_CUDA_RETURN_IF_ERROR(
      cudaStreamCreateWithFlags(&backend->stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  std::vector<std::string> warnings;
  auto uploaded = DeviceWeights::Upload(
      config, weights, options.sixteen_bit_weights ? WeightFormat::k16Bit : WeightFormat::kFloat32,
      options.allow_non_finite_weights, &warnings);
  if (!uploaded.ok()) return uploaded.status();
  backend->weights_ = *std::move(uploaded);
  // Only a backend that was created warns (--device auto may go on to another).
  if (options.warnings != nullptr) {
    options.warnings->insert(options.warnings->end(), warnings.begin(), warnings.end());
  }
  return std::unique_ptr<Backend>(std::move(backend));
}

absl::Status CudaBackend::TabulatePositions() {
  const AttentionConfig& attn = config_.attention;
  std::vector<float> cos_table, sin_table;
  RopeTables(table_positions_, attn.RotaryDims(), attn.rope_base, &cos_table, &sin_table);
  if (absl::Status s = rope_cos_.Upload(cos_table.data(), cos_table.size() * 4); !s.ok()) return s;
  if (absl::Status s = rope_sin_.Upload(sin_table.data(), sin_table.size() * 4); !s.ok()) return s;
  return TabulateXlPositions();
}

absl::Status CudaBackend::TabulateXlPositions() {
  const AttentionConfig& attn = config_.attention;
  if (!attn.IsXl()) return absl::OkStatus();
  const int H = attn.n_heads, dh = attn.head_dim, d = config_.d_model;
  const int positions = table_positions_;
  // pe(-delta) scaled by dh^-1/4, the CPU backend's formula, in double.
  std::vector<double> pe(static_cast<size_t>(positions) * d);
  std::vector<double> frequency(d / 2);
  for (int m = 0; m < d / 2; ++m) {
    frequency[m] = std::exp(static_cast<double>(2 * m) * (-std::log(10000.0) / d));
  }
  const double scale = std::pow(static_cast<double>(dh), -0.25);
  for (int delta = 0; delta < positions; ++delta) {
    const double relative = -static_cast<double>(delta);
    for (int m = 0; m < d / 2; ++m) {
      pe[static_cast<size_t>(delta) * d + 2 * m] = scale * std::sin(relative * frequency[m]);
      pe[static_cast<size_t>(delta) * d + 2 * m + 1] = scale * std::cos(relative * frequency[m]);
    }
  }
  DeviceBuffer device_pe;
  if (absl::Status s = device_pe.Upload(pe.data(), pe.size() * sizeof(double)); !s.ok()) return s;
  xl_keys_.clear();
  xl_keys_.resize(config_.n_layers);
  for (int l = 0; l < config_.n_layers; ++l) {
    const size_t bytes = static_cast<size_t>(H) * positions * dh * sizeof(float);
    if (absl::Status s = xl_keys_[l].Grow(bytes); !s.ok()) return s;
    SWITCHSERVE_CUDA_RETURN_IF_ERROR(
        LaunchXlPositionKeys(weights_->layer(l).attn.pos_to_pk, device_pe.as<double>(), H, dh, d,
                             positions, xl_keys_[l].as<float>(), stream_),
        "XL position keys");
  }
  // device_pe is freed on return: wait for the kernels reading it.
  return CudaStatus(cudaStreamSynchronize(stream_), "XL position keys");
}

int64_t CudaBackend::KvBytesPerToken() const {
  return switchserve::KvBytesPerToken(config_, DTypeSize(kv_cache_dtype()));
}

absl::Status CudaBackend::InitKvCache(int64_t num_blocks, int block_size) {
  if (absl::Status s = CheckKvBlockFitsAttention(config_.attention, options_.device, block_size);
      !s.ok()) {
    return s;
  }
  if (num_blocks <= 0 || block_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("KV cache: num_blocks (", num_blocks,
                                                   ") and block_size (", block_size,
                                                   ") must be positive"));
  }
  const AttentionConfig& attn = config_.attention;
  const int64_t element = DTypeSize(kv_cache_dtype());
  // One more block than asked: padding rows of decode graphs write there.
  const int64_t rows = (num_blocks + 1) * block_size;
  const int64_t k_row = static_cast<int64_t>(attn.n_kv_heads) * attn.head_dim;
  const int64_t v_row = k_row * attn.CachedValuesPerKvHead();
  k_cache_.clear();
  v_cache_.clear();
  k_cache_.resize(config_.n_layers);
  v_cache_.resize(config_.n_layers);
  for (int l = 0; l < config_.n_layers; ++l) {
    absl::Status s = k_cache_[l].Grow(rows * k_row * element);
    if (s.ok()) s = v_cache_[l].Grow(rows * v_row * element);
    if (!s.ok()) {
      k_cache_.clear();
      v_cache_.clear();
      num_blocks_ = 0;
      block_size_ = 0;
      return absl::ResourceExhaustedError(
          absl::StrCat("KV cache: cannot allocate ", num_blocks, " blocks of ", block_size,
                       " tokens (", KvBytesPerToken() * rows, " bytes): ", s.message()));
    }
  }
  num_blocks_ = num_blocks;
  block_size_ = block_size;
  // A position needs its token's row in the cache: the tables end where the
  // cache or the context does (not at max_seq_len alone, which the config
  // may set in the billions).
  table_positions_ = static_cast<int>(std::min<int64_t>(config_.max_seq_len, rows));
  if (absl::Status s = TabulatePositions(); !s.ok()) return s;
  segment_tokens_ = options_.attention_segment_tokens;
  if (segment_tokens_ <= 0) {
    segment_tokens_ = static_cast<int>(
        std::max<int64_t>(kDefaultSegmentTokens, (int64_t{config_.max_seq_len} + 63) / 64));
  }
  segment_tokens_ =
      (std::max(segment_tokens_, block_size) + block_size - 1) / block_size * block_size;
  AttentionShape shape = AttentionShapeOf(attn, block_size);
  shape.segment_tokens = segment_tokens_;
  query_tile_ = AttentionQueryTile(shape, 48 * 1024);
  StepModel model;
  model.vocab = config_.vocab_size;
  model.max_seq_len = table_positions_;  // the positions a step can hold
  model.block_size = block_size;
  model.kv_blocks = num_blocks;
  model.query_tile = query_tile_;
  model.segment_tokens = segment_tokens_;
  model.layout = &layout_;
  if (dispatch_.scope == CapacityScope::kSequence) model.capacity_group = dispatch_.capacity_group;
  model.carries_loads = dispatch_.CarriesGroupLoads();
  io_ = std::make_unique<StepIo>(model);
  return absl::OkStatus();
}

absl::Status CudaBackend::Forward(const StepBatch& batch, StepOutput* out) {
  if (block_size_ == 0) return absl::FailedPreconditionError("Forward before InitKvCache");
  // Positions past the tables (the cache's rows) have no token row either.
  if (absl::Status s =
          ValidateStepBatch(batch, config_.vocab_size, table_positions_, num_blocks_, block_size_);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = group_loads_.Gather(batch, dispatch_, layout_.total_experts()); !s.ok()) {
    return s;
  }
  out->Clear(config_.vocab_size, layout_.routers());
  const int T = batch.num_tokens();
  if (T == 0) return absl::OkStatus();

  if (options_.decode_graphs && options_.forced_routing == nullptr &&
      GraphEligible(batch, dispatch_, table_positions_, num_blocks_)) {
    const int bucket = DecodeBucket(batch.num_sequences());
    PadDecodeStep(batch, bucket, static_cast<int32_t>(num_blocks_), &padded_);
    if (absl::Status s = RunStep(padded_, T, bucket); !s.ok()) return s;
  } else {
    if (absl::Status s = RunStep(batch, T, 0); !s.ok()) return s;
  }
  io_->CarriedOut(group_loads_.rows());
  group_loads_.Commit(batch);
  io_->Fill(batch, out);
  return absl::OkStatus();
}

absl::Status CudaBackend::RunStep(const StepBatch& batch, int real_tokens, int bucket) {
  if (absl::Status s = io_->Prepare(batch, real_tokens, bucket, group_loads_.rows()); !s.ok()) {
    return s;
  }
  if (absl::Status s = GrowWorkspace(); !s.ok()) return s;
  if (absl::Status s = io_->Upload(stream_); !s.ok()) return s;
  if (options_.forced_routing != nullptr) {
    if (absl::Status s = UploadForcedRouting(batch); !s.ok()) return s;
  }
  const simt::ScopedDependentLaunch dependent(io_->shape().tokens <= kDependentLaunchMaxTokens);
  absl::Status launched;
  if (bucket > 0) {
    launched = graphs_.Run(bucket, io_->epoch() + workspace_epoch_, stream_,
                           [this] { return Launches(); });
  } else {
    launched = Launches();
  }
  if (!launched.ok()) {
    cudaStreamSynchronize(stream_);
    return launched;
  }
  return io_->Download(stream_, io_->collect());
}

absl::Status CudaBackend::UploadForcedRouting(const StepBatch& batch) {
  const std::vector<TokenRouting>& forced = *options_.forced_routing;
  const int T = batch.num_tokens();
  if (forced.size() != static_cast<size_t>(T)) {
    return absl::InvalidArgumentError(
        absl::StrCat("forced routing for ", forced.size(), " tokens, the step has ", T));
  }
  const int64_t per_token = layout_.choices_per_token();
  const size_t assignments = static_cast<size_t>(T) * per_token;
  std::vector<int32_t> expert(assignments);
  std::vector<float> gate(assignments);
  std::vector<uint8_t> fate(assignments);
  for (size_t r = 0; r < layout_.size(); ++r) {
    const int k = layout_[r].top_k;
    const int64_t base = io_->trace_offset(static_cast<int>(r));
    for (int t = 0; t < T; ++t) {
      if (forced[t].choices.size() != static_cast<size_t>(per_token)) {
        return absl::InvalidArgumentError(absl::StrCat("forced routing of token ", t, " has ",
                                                       forced[t].choices.size(), " choices"));
      }
      for (int i = 0; i < k; ++i) {
        const RouteChoice& c = forced[t].choices[layout_.ChoiceOffset(static_cast<int>(r)) + i];
        const int64_t at = base + static_cast<int64_t>(t) * k + i;
        expert[at] = c.expert;
        gate[at] = c.gate;
        fate[at] = static_cast<uint8_t>(c.fate);
      }
    }
  }
  const DeviceResults& r = io_->results();
  SWITCHSERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(r.trace_expert, expert.data(), assignments * 4,
                                                   cudaMemcpyHostToDevice, stream_),
                                   "forced routing");
  SWITCHSERVE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(r.trace_gate, gate.data(), assignments * 4, cudaMemcpyHostToDevice, stream_),
      "forced routing");
  SWITCHSERVE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(r.trace_fate, fate.data(), assignments, cudaMemcpyHostToDevice, stream_),
      "forced routing");
  // The host vectors go out of scope: wait for the copies.
  return CudaStatus(cudaStreamSynchronize(stream_), "forced routing");
}

absl::Status CudaBackend::Launches() {
  const StepShape& shape = io_->shape();
  const DeviceStep& step = io_->device();
  const int T = shape.tokens;
  const int d = config_.d_model;
  const float eps = static_cast<float>(config_.norm_eps);
  float* x = ws_.x.as<float>();
  float* xn = ws_.xn.as<float>();
  SWITCHSERVE_CUDA_RETURN_IF_ERROR(LaunchEmbed(step.token_ids, T, weights_->embedding().data,
                                               weights_->embedding().type, d, x, stream_),
                                   "embedding");
  for (int l = 0; l < config_.n_layers; ++l) {
    const DeviceLayerWeights& lw = weights_->layer(l);
    SWITCHSERVE_CUDA_RETURN_IF_ERROR(
        LaunchNormRows(Norm(config_.norm), eps, x, T, d, lw.attn_norm_w, lw.attn_norm_b, xn,
                       nullptr, stream_),
        "attention norm");
    if (absl::Status s = Attention(l); !s.ok()) return s;
    SWITCHSERVE_CUDA_RETURN_IF_ERROR(LaunchNormRows(Norm(config_.norm), eps, x, T, d, lw.ffn_norm_w,
                                                    lw.ffn_norm_b, xn, nullptr, stream_),
                                     "ffn norm");
    if (absl::Status s = Ffn(l); !s.ok()) return s;
  }
  if (absl::Status s = OutputHead(); !s.ok()) return s;
  return Sample();
}

absl::Status CudaBackend::OutputHead() {
  const StepShape& shape = io_->shape();
  const int R = shape.head_rows;
  if (R == 0) return absl::OkStatus();
  const int d = config_.d_model;
  float* in = ws_.head_in.as<float>();
  float* normed = ws_.head_norm.as<float>();
  SWITCHSERVE_CUDA_RETURN_IF_ERROR(
      LaunchGatherRows(ws_.x.as<float>(), d, io_->device().head_rows, R, d, in, d, stream_),
      "head rows");
  SWITCHSERVE_CUDA_RETURN_IF_ERROR(
      LaunchNormRows(Norm(config_.norm), static_cast<float>(config_.norm_eps), in, R, d,
                     weights_->final_norm_w(), weights_->final_norm_b(), normed, nullptr, stream_),
      "final norm");
  const LinearWeights head = weights_->output_head().Linear(WeightLayout::kNK, d);
  LinearEpilogue bias;
  bias.bias = weights_->output_bias();  // null without output_bias
  SWITCHSERVE_CUDA_RETURN_IF_ERROR(LaunchLinear(normed, d, R, d, head, config_.vocab_size, bias,
                                                io_->results().logits, config_.vocab_size, stream_),
                                   "output head");
  return absl::OkStatus();
}

absl::Status CudaBackend::Sample() {
  const StepShape& shape = io_->shape();
  if (shape.samples == 0) return absl::OkStatus();
  const DeviceResults& r = io_->results();
  SamplingArgs a;
  a.logits = r.logits;
  a.logits_ld = config_.vocab_size;
  a.vocab = config_.vocab_size;
  a.params = io_->device().samples;
  a.samples = shape.samples;
  a.history = io_->device().history;
  a.scratch = ws_.sampling.get();
  a.max_logprobs = shape.max_logprobs;
  a.token = r.sample_token;
  a.logprob = r.sample_logprob;
  a.top_ids = r.top_ids;
  a.top_logprobs = r.top_logprobs;
  return CudaStatus(LaunchSampling(a, stream_), "sampling");
}

absl::Status CudaBackend::GrowWorkspace() {
  const StepShape& shape = io_->shape();
  const AttentionConfig& attn = config_.attention;
  const FfnConfig& ffn = config_.ffn;
  const size_t T = static_cast<size_t>(shape.tokens);
  const size_t d = config_.d_model, H = attn.n_heads, G = attn.n_kv_heads, dh = attn.head_dim;
  const size_t E = attn.n_experts, ka = attn.top_k, ev = attn.CachedValuesPerKvHead();
  const size_t X = ffn.kind == FfnKind::kMoe ? ffn.n_experts : 1;
  const size_t kf = ffn.kind == FfnKind::kMoe ? ffn.top_k : 1, F = ffn.d_ff;
  const size_t routers = std::max<size_t>(attn.ValueRouterHeads(), attn.OutputRouterHeads());
  const size_t assignments = std::max(routers * T * ka, T * kf);
  const size_t f = sizeof(float);
  struct Need {
    DeviceBuffer* buffer;
    size_t bytes;
  };
  const Need needs[] = {
      {&ws_.x, T * d * f},
      {&ws_.xn, T * d * f},
      {&ws_.qk, T * (H + G) * dh * f},
      {&ws_.v, T * G * ev * dh * f},
      {&ws_.a, T * H * dh * f},
      {&ws_.router_logits, T * std::max({routers * E, X, H}) * f},
      {&ws_.route_expert, assignments * 4},
      {&ws_.route_weight, assignments * f},
      {&ws_.route_prob, std::max(routers * T * E, T * X) * f},
      {&ws_.offsets, std::max(routers * (E + 1), X + 1) * 4},
      {&ws_.slot_token, assignments * 4},
      {&ws_.slot_weight, assignments * f},
      {&ws_.assign_slot, assignments * 4},
      {&ws_.prod, std::max({G * T * ka * dh, H * T * ka * d, T * kf * d}) * f},
      {&ws_.hidden, T * std::max<size_t>(kf, 1) * F * f},
      {&ws_.partials, T * H * shape.max_segments * (dh + 2) * f},
      {&ws_.value_weights, T * G * E * f},
      {&ws_.head_in, static_cast<size_t>(shape.head_rows) * d * f},
      {&ws_.head_norm, static_cast<size_t>(shape.head_rows) * d * f},
      {&ws_.sampling,
       static_cast<size_t>(shape.samples) * SamplingScratchBytes(config_.vocab_size)},
      // Sequence scope: each dispatch segment's loads and reroute marks.
      {&ws_.dispatch_loads, std::max(routers * E, X) * shape.dispatch_segments * 4},
      {&ws_.dispatch_taken, std::max(routers * E, X) * shape.dispatch_segments},
  };
  for (const Need& need : needs) {
    bool moved = false;
    if (absl::Status s = need.buffer->Grow(need.bytes, &moved); !s.ok()) return s;
    workspace_epoch_ += moved ? 1 : 0;
  }
  return absl::OkStatus();
}

}  // namespace cuda
}  // namespace switchserve
