// One decode step and one prefill chunk of the paper's 262M SwitchAll shape
// (d=1024, 18 layers, SwitchHead H=4 E=4 k=2 dh=112, MoE FFN of 32 experts of
// size 128 with sigmoid gates and k=4; random weights) on the CPU backend,
// with RoPE (xl:0) or the paper's XL relative positions (xl:1), the weight
// matrices held in f32 or bf16 (bf16:1), reported next to this machine's
// sgemm rate and memory read bandwidth, measured in the same process
// (bench/roofline.h).
//
// Counters: tokens_per_s; gflops and gb_per_s achieved (FLOPs of the matmuls
// and attention actually run; bytes of the weights the step touched, as held
// - the experts that received tokens - plus the KV cache read); *_of_peak:
// those as fractions of the measured limits; of_roofline: the time the
// roofline allows for the step's bytes and FLOPs, max(bytes / bandwidth,
// FLOPs / sgemm rate), over the measured time; step_gflop, step_gb and the
// machine_* limits, for bench/roofline_chart.py.
//
//   build/release/bench/engine_bench --benchmark_counters_tabular=true
//       --benchmark_out=engine_bench.json --benchmark_out_format=json
//   /usr/bin/python3 bench/roofline_chart.py engine_bench.json docs/roofline.png
#include <benchmark/benchmark.h>

#include <algorithm>
#include <memory>

#include "bench/roofline.h"
#include "engine/model/model_loader.h"
#include "engine/runtime/kv_cache.h"
#include "kernels/backends.h"
#include "tests/util/random_model.h"

namespace switchserve {
namespace {

struct PaperModel {
  explicit PaperModel(PositionKind position) {
    config.attention.position = position;
    weights = testing::RandomWeights(config, /*seed=*/262);
    bf16 = ConvertWeights(config, weights, WeightsDtype::kBF16);
  }
  ModelConfig config = testing::PaperSwitchAllConfig();
  ModelWeights weights;
  ModelWeights bf16;
  const ModelWeights& Held(bool half) const { return half ? bf16 : weights; }
};

// The paper's shape with RoPE (xl = 0) or XL positions (xl = 1).
const PaperModel& Paper(int64_t xl) {
  static const PaperModel* rope = new PaperModel(PositionKind::kRope);
  if (xl == 0) return *rope;
  static const PaperModel* relative = new PaperModel(PositionKind::kXl);
  return *relative;
}

// Work one step did, from the routing statistics of that step.
struct StepWork {
  double flops = 0;
  double bytes = 0;
};

StepWork MeasureWork(const ModelConfig& config, const ModelWeights& weights, const StepOutput& out,
                     int64_t new_tokens, int64_t attended_pairs, int64_t cached_tokens_read,
                     int64_t max_context) {
  const double d = config.d_model, dh = config.attention.head_dim;
  const double H = config.attention.n_heads, G = config.attention.n_kv_heads;
  const double E = config.attention.n_experts, F = config.ffn.d_ff, X = config.ffn.n_experts;
  // Bytes per value as held (every layer holds the same dtypes).
  const LayerWeights& layer = weights.layers[0];
  const double matrix_bytes = DTypeSize(layer.attn.q.dtype());
  const double router_bytes = DTypeSize(layer.ffn.router_w.dtype());
  StepWork work;
  // Per layer, always: q, k projections and the routers.
  const double projection_params = (H + G) * dh * d;
  const double router_params = (G * E + H * E) * d + X * d;
  work.flops += 2 * (projection_params + router_params) * new_tokens * config.n_layers;
  work.bytes += (matrix_bytes * projection_params + router_bytes * router_params) * config.n_layers;
  const RouterLayout layout(config);
  const std::vector<RouterId>& ids = layout.routers();
  for (size_t r = 0; r < ids.size(); ++r) {
    const RouterStepStats& stats = out.stats.routers[r];
    const double expert_params = ids[r].module == MoeModule::kFfn ? 2 * F * d : d * dh;
    for (size_t e = 0; e < stats.kept.size(); ++e) {
      work.flops += 2 * expert_params * stats.kept[e];
      if (stats.kept[e] > 0) work.bytes += matrix_bytes * expert_params;
    }
  }
  // Attention: q.k and p.v for every (query, key) pair and head; with XL
  // also q.R[i - j], reading one table row per head and distance.
  work.flops += 4.0 * H * dh * attended_pairs * config.n_layers;
  work.bytes += 4.0 * 2 * G * dh * cached_tokens_read * config.n_layers;
  if (config.attention.IsXl()) {
    work.flops += 2.0 * H * dh * attended_pairs * config.n_layers;
    work.bytes += 4.0 * H * dh * max_context * config.n_layers;
  }
  // Output head for the rows returned.
  const double rows = static_cast<double>(out.logits.size()) / config.vocab_size;
  work.flops += 2.0 * config.vocab_size * d * rows;
  work.bytes += DTypeSize(weights.OutputHead().dtype()) * config.vocab_size * d;
  return work;
}

void Report(benchmark::State& state, const StepWork& work, int64_t tokens_per_step) {
  const bench::MachineLimits& limits = bench::MeasureMachineLimits();
  const double steps = static_cast<double>(state.iterations());
  state.counters["tokens_per_s"] =
      benchmark::Counter(tokens_per_step * steps, benchmark::Counter::kIsRate);
  state.counters["gflops"] =
      benchmark::Counter(work.flops * steps / 1e9, benchmark::Counter::kIsRate);
  state.counters["gb_per_s"] =
      benchmark::Counter(work.bytes * steps / 1e9, benchmark::Counter::kIsRate);
  state.counters["gflops_of_peak"] = benchmark::Counter(
      work.flops * steps / 1e9 / limits.sgemm_gflops, benchmark::Counter::kIsRate);
  state.counters["gb_per_s_of_peak"] = benchmark::Counter(
      work.bytes * steps / 1e9 / limits.read_gb_per_s, benchmark::Counter::kIsRate);
  // The roofline's time for one step over the measured one: 1 / (time per step).
  const double roofline_s =
      std::max(work.bytes / 1e9 / limits.read_gb_per_s, work.flops / 1e9 / limits.sgemm_gflops);
  state.counters["of_roofline"] =
      benchmark::Counter(roofline_s * steps, benchmark::Counter::kIsRate);
  state.counters["step_gflop"] = work.flops / 1e9;
  state.counters["step_gb"] = work.bytes / 1e9;
  state.counters["machine_sgemm_gflops"] = limits.sgemm_gflops;
  state.counters["machine_read_gb_per_s"] = limits.read_gb_per_s;
}

// A decode step for `batch` sequences that each hold `context` tokens.
void BM_DecodeStep(benchmark::State& state) {
  const int batch = static_cast<int>(state.range(0));
  const int context = static_cast<int>(state.range(1));
  const PaperModel& model = Paper(state.range(2));
  const ModelWeights& weights = model.Held(state.range(3) != 0);
  bench::MeasureMachineLimits();
  std::unique_ptr<Backend> backend =
      *CreateBackend(DeviceKind::kCpu, model.config, weights, model.config.dispatch);
  const int block_size = 16;
  KvCacheOptions cache;
  cache.block_size = block_size;
  cache.max_tokens = int64_t{batch} * ((context + 1 + block_size - 1) / block_size) * block_size;
  absl::StatusOr<std::unique_ptr<KvCache>> kv_cache = KvCache::Create(backend.get(), cache);
  if (!kv_cache.ok()) {
    state.SkipWithError("KV cache setup failed");
    return;
  }
  KvBlockAllocator& allocator = (*kv_cache)->allocator();
  StepBatch prefill;
  prefill.Clear(block_size);
  for (int s = 0; s < batch; ++s) {
    if (!allocator.Reserve(s, context + 1).ok()) {
      state.SkipWithError("KV reserve failed");
      return;
    }
    std::vector<int32_t> tokens;
    for (int i = 0; i < context; ++i) tokens.push_back((s * 131 + i * 7) % 8000);
    prefill.Add(tokens, 0, allocator.BlockTable(s));
  }
  StepOutput out;
  if (!backend->Forward(prefill, &out).ok()) {
    state.SkipWithError("prefill failed");
    return;
  }
  // Every sequence returns its logits, as a decode step of the engine
  // computes them before sampling.
  StepBatch decode;
  decode.Clear(block_size);
  for (int s = 0; s < batch; ++s) {
    const std::vector<int32_t> token = {(s * 17 + 3) % 8000};
    decode.Add(token, context, allocator.BlockTable(s)).logits = LogitsMode::kLast;
  }
  for (auto _ : state) {
    if (!backend->Forward(decode, &out).ok()) {
      state.SkipWithError("decode failed");
      return;
    }
  }
  Report(state,
         MeasureWork(model.config, weights, out, batch, static_cast<int64_t>(batch) * (context + 1),
                     static_cast<int64_t>(batch) * (context + 1), context + 1),
         batch);
}
BENCHMARK(BM_DecodeStep)
    ->ArgNames({"batch", "context", "xl", "bf16"})
    ->Args({1, 128, 0, 0})
    ->Args({1, 128, 0, 1})
    ->Args({1, 128, 1, 0})
    ->Args({8, 128, 0, 0})
    ->Args({8, 128, 0, 1})
    ->Args({8, 128, 1, 0})
    ->Args({32, 128, 0, 0})
    ->Args({32, 128, 0, 1})
    ->Args({32, 128, 1, 0})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// A prefill chunk of `chunk` tokens of one new sequence.
void BM_PrefillChunk(benchmark::State& state) {
  const int length = static_cast<int>(state.range(0));
  const PaperModel& model = Paper(state.range(1));
  const ModelWeights& weights = model.Held(state.range(2) != 0);
  bench::MeasureMachineLimits();
  std::unique_ptr<Backend> backend =
      *CreateBackend(DeviceKind::kCpu, model.config, weights, model.config.dispatch);
  KvCacheOptions cache;
  cache.block_size = 16;
  cache.max_tokens = length;
  absl::StatusOr<std::unique_ptr<KvCache>> kv_cache = KvCache::Create(backend.get(), cache);
  if (!kv_cache.ok() || !(*kv_cache)->allocator().Reserve(0, length).ok()) {
    state.SkipWithError("cache setup failed");
    return;
  }
  std::vector<int32_t> tokens;
  for (int i = 0; i < length; ++i) tokens.push_back((i * 37 + 11) % 8000);
  StepBatch input;
  input.Clear(16);
  input.Add(tokens, 0, (*kv_cache)->allocator().BlockTable(0)).logits = LogitsMode::kLast;
  StepOutput out;
  for (auto _ : state) {
    if (!backend->Forward(input, &out).ok()) {
      state.SkipWithError("prefill failed");
      return;
    }
  }
  const int64_t pairs = static_cast<int64_t>(length) * (length + 1) / 2;
  Report(state, MeasureWork(model.config, weights, out, length, pairs, length, length), length);
}
BENCHMARK(BM_PrefillChunk)
    ->ArgNames({"tokens", "xl", "bf16"})
    ->Args({512, 0, 0})
    ->Args({512, 0, 1})
    ->Args({512, 1, 0})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace
}  // namespace switchserve

BENCHMARK_MAIN();
