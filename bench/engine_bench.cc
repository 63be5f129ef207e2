// Decode steps and a prefill chunk of the paper's 262M SwitchAll shape
// (d=1024, 18 layers, SwitchHead H=4 E=4 k=2 dh=112, MoE FFN of 32 experts
// of size 128 with sigmoid gates and k=4; random weights) on a backend,
// reported next to the hardware's limits measured in the same process:
//
//   --device=cpu   (default) the CPU backend, with RoPE (switchall), with the
//                  weight matrices held in bf16 (switchall_bf16) and with the
//                  paper's XL relative positions (switchall_xl); decode at
//                  batch 1, 8, 32 (context 128) and 1, 8 (context 2000) and a
//                  512-token prefill; limits: sgemm rate
//                  and memory read bandwidth (bench/roofline.h).
//   --device=cuda  the CUDA backend (16-bit weights, decode steps sampling
//                  greedily on the device, as the engine runs them); decode at
//                  batch 1, 8, 32, 64, 256 (context 128) and 1, 8 (context
//                  2000), a continuous-batching step (30 sequences decoding
//                  beside 2 running 32-token prompts) and a 2048-token
//                  prefill, for the SwitchAll model and a
//                  dense-attention baseline of matched parameters (10
//                  dense heads of 112: the same attention parameter count
//                  within 1%, the same MoE FFN); limits: device-to-device
//                  copy bandwidth and the cuBLAS bf16 GEMM rate
//                  (kernels/backends.h, MeasureDeviceLimits).
//   --smoke        tiny models and short runs: checks the whole benchmark
//                  end to end (on the emulated CUDA backend too).
//   --kv-cache-dtype=auto|f32|bf16
//                  the KV cache's element type (BackendOptions; auto, the
//                  default, follows the weights: on the CPU backend bf16
//                  for switchall_bf16 and f32 for the others, on the CUDA
//                  backend bf16 beside its 16-bit weights); the bytes
//                  counted for attention follow it.
//   --kernel-isa=avx512|avx2|generic
//                  CPU: the build of the kernels (BackendOptions::cpu_kernels;
//                  default: the fastest this CPU runs), to compare builds on
//                  one machine.
//   --threads=N    host threads of the backend (BackendOptions::num_threads;
//                  default: all cores): how a step scales with cores. The
//                  machine's limits are still measured on all cores.
//   --weight-copies=0|1
//                  CPU: whether the backend keeps tiled copies of the weights
//                  for one-row products (BackendOptions::cpu_weight_copies,
//                  the server's --cpu-weight-copies; default 1), to measure
//                  what they give a batch-1 step.
//   --pool-timeline=FILE
//                  CPU: appends a timeline of each timed loop to FILE: when
//                  every step started and every job the worker pool shared
//                  out (bench/pool_timeline.py summarizes it: the time a
//                  step spends inside parallel jobs and between them, job
//                  by job).
//   --openblas-core
//                  prints the core OPENBLAS_CORETYPE should name on this CPU
//                  where OpenBLAS's own detection picks narrower kernels
//                  (bench/roofline.h, OpenBlasCoreToForce), else nothing,
//                  and exits; run it without the variable. Without this
//                  flag, engine_bench starts itself again with that core
//                  (UseThisCpusOpenBlasKernels), so that the sgemm limit is
//                  this CPU's; compare_pytorch.py runs the reference on it.
//   --attention-segment-tokens=N
//                  CUDA: keys per attention segment (default 128, or
//                  max_seq_len / 64 where that is more; rounded up to whole
//                  KV blocks): a decode step's attention splits its
//                  context into segments computed in parallel and merged.
//
// Counters: tokens_per_s; gflops and gb_per_s achieved (FLOPs of the matmuls
// and attention actually run; bytes of the weights the step touched, as held
// - the experts that received tokens - plus the KV cache read); *_of_peak:
// those as fractions of the measured limits; of_roofline: the time the
// roofline allows for the step's bytes and FLOPs, max(bytes / bandwidth,
// FLOPs / compute rate), over the measured time; step_gflop, step_gb and the
// machine_* limits, for bench/roofline_chart.py. On the CPU (not --smoke)
// the limits are measured again right before and right after each run of
// the timed loop: of_adjacent_roofline is of_roofline against the larger
// of each pair (adjacent_read_gb_per_s, adjacent_sgemm_gflops), limits of
// the same minutes on a machine whose limits drift; adjacent_round_trip_ns
// (the larger of the pair) says how the cores sat meanwhile: a VM whose
// vCPUs the host moves between one core complex and two (bench/roofline.h)
// reads memory up to twice as fast in the second placement, and the step
// follows only where each core streams at its own link's rate.
//
//   build/release/bench/engine_bench --benchmark_counters_tabular=true
//       --benchmark_out=engine_bench.json --benchmark_out_format=json
//   /usr/bin/python3 bench/roofline_chart.py engine_bench.json docs/roofline.png
//   build/cuda-bench/bench/engine_bench --device=cuda --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "bench/roofline.h"
#include "engine/model/model_loader.h"
#include "engine/runtime/kv_cache.h"
#include "engine/runtime/sampler.h"
#include "kernels/backends.h"
#include "tests/util/random_model.h"

namespace switchserve {
namespace {

struct Settings {
  DeviceKind device = DeviceKind::kCpu;
  bool smoke = false;
  int attention_segment_tokens = 0;  // CUDA; 0: the backend's default
  KvCacheDtype kv_cache_dtype = KvCacheDtype::kAuto;
  int threads = 0;                           // host threads of the backend; 0: all cores
  std::optional<cpu::KernelIsa> kernel_isa;  // CPU; none: the fastest
  std::string pool_timeline;                 // CPU; empty: no timeline
  bool weight_copies = true;                 // CPU; BackendOptions::cpu_weight_copies
};
Settings& settings() {
  static Settings s;
  return s;
}

// The timed loop: `backend` computes `step` once an iteration. With
// --pool-timeline=FILE, the start of every step, the end of the last and
// every job the CPU backend's worker pool shared out meanwhile
// (RecordCpuPoolJobs) are appended to FILE under `name` (the
// benchmark's), for bench/pool_timeline.py:
//   <name> step <start ns>
//   <name> job <start ns> <end ns> <pieces> <pieces the engine thread ran>
//       <when the engine thread ran out of pieces ns> <when the workers did ns, or 0>
//   <name> end <end ns>
// Returns false (and marks the run failed) where a step failed.
bool TimedSteps(benchmark::State& state, const std::string& name, Backend& backend,
                const StepBatch& step, StepOutput* out) {
  const bool timeline = !settings().pool_timeline.empty();
  std::vector<int64_t> starts;
  std::vector<cpu::PoolJobSpan> jobs;
  if (timeline) RecordCpuPoolJobs(&jobs);
  bool ok = true;
  for (auto _ : state) {
    if (timeline) starts.push_back(cpu::SteadyNowNs());
    if (!backend.Forward(step, out).ok()) {
      state.SkipWithError("step failed");
      ok = false;
      break;
    }
  }
  if (!timeline) return ok;
  const int64_t end = cpu::SteadyNowNs();
  RecordCpuPoolJobs(nullptr);
  FILE* file = std::fopen(settings().pool_timeline.c_str(), "a");
  if (file == nullptr) {
    state.SkipWithError("--pool-timeline: cannot open the file");
    return false;
  }
  for (const int64_t start : starts) {
    std::fprintf(file, "%s step %lld\n", name.c_str(), static_cast<long long>(start));
  }
  for (const cpu::PoolJobSpan& job : jobs) {
    std::fprintf(file, "%s job %lld %lld %d %d %lld %lld\n", name.c_str(),
                 static_cast<long long>(job.start_ns), static_cast<long long>(job.end_ns),
                 job.pieces, job.caller_pieces, static_cast<long long>(job.caller_end_ns),
                 static_cast<long long>(job.workers_end_ns));
  }
  std::fprintf(file, "%s end %lld\n", name.c_str(), static_cast<long long>(end));
  std::fclose(file);
  return ok;
}

// The dense-attention baseline of `config`: dense multi-head attention with
// as many heads of the same size as match SwitchHead's attention parameters.
ModelConfig DenseBaseline(ModelConfig config) {
  const AttentionConfig& a = config.attention;
  const double d = config.d_model, dh = a.head_dim;
  const double switchhead =
      (a.n_heads + a.n_kv_heads) * dh * d + (a.n_kv_heads + a.n_heads) * a.n_experts * (dh * d + d);
  const int heads = static_cast<int>(std::lround(switchhead / (4 * dh * d)));
  config.name = "dense_baseline";
  config.attention.kind = AttentionKind::kDense;
  config.attention.n_heads = heads;
  config.attention.n_kv_heads = heads;
  config.attention.n_experts = 1;
  config.attention.top_k = 1;
  return config;
}

struct BenchModel {
  ModelConfig config;
  ModelWeights weights;
};

const BenchModel& Model(const std::string& name) {
  static std::map<std::string, std::unique_ptr<BenchModel>>* models =
      new std::map<std::string, std::unique_ptr<BenchModel>>();
  std::unique_ptr<BenchModel>& model = (*models)[name];
  if (model == nullptr) {
    model = std::make_unique<BenchModel>();
    ModelConfig switchall =
        settings().smoke ? testing::TinySwitchAllConfig() : testing::PaperSwitchAllConfig();
    if (name == "switchall_xl") switchall.attention.position = PositionKind::kXl;
    model->config = name == "dense" ? DenseBaseline(switchall) : switchall;
    model->weights = testing::RandomWeights(model->config, /*seed=*/262);
    if (name == "switchall_bf16") {
      model->weights = ConvertWeights(model->config, model->weights, WeightsDtype::kBF16);
    }
  }
  return *model;
}

// The limits the achieved rates are compared with: GB/s and GFLOP/s.
struct Limits {
  double gb_per_s = 0;
  double gflops = 0;
};

const Limits& MeasuredLimits() {
  static const Limits* limits = [] {
    auto* l = new Limits();
    if (settings().device == DeviceKind::kCpu) {
      const bench::MachineLimits& m = bench::MeasureMachineLimits();
      l->gb_per_s = m.read_gb_per_s;
      l->gflops = m.sgemm_gflops;
      benchmark::AddCustomContext("sgemm_kernels", bench::SgemmKernels());
    } else {
      absl::StatusOr<DeviceLimits> m = MeasureDeviceLimits(settings().device, settings().smoke);
      if (m.ok()) {
        l->gb_per_s = m->copy_gb_per_s;
        l->gflops = m->gemm_tflops * 1e3;
        benchmark::AddCustomContext("device", m->device);
        benchmark::AddCustomContext("copy_gb_per_s", std::to_string(m->copy_gb_per_s));
        benchmark::AddCustomContext("gemm_bf16_tflops", std::to_string(m->gemm_tflops));
      }
    }
    return l;
  }();
  return *limits;
}

// Bytes of one weight matrix element as the backend holds it: the CPU
// backend as loaded, the CUDA backend in 16 bits.
double MatrixBytes(const ModelWeights& weights) {
  if (settings().device != DeviceKind::kCpu) return 2.0;
  return static_cast<double>(DTypeSize(weights.layers[0].attn.q.dtype()));
}

// Work one step did, from the routing statistics of that step.
struct StepWork {
  double flops = 0;
  double bytes = 0;
};

StepWork MeasureWork(const ModelConfig& config, const ModelWeights& weights, const StepOutput& out,
                     int64_t new_tokens, int64_t attended_pairs, int64_t cached_tokens_read,
                     int64_t max_context, int64_t head_rows) {
  const AttentionConfig& a = config.attention;
  const double d = config.d_model, dh = a.head_dim, H = a.n_heads, G = a.n_kv_heads;
  const double E = a.n_experts, F = config.ffn.d_ff, X = config.ffn.n_experts;
  const double matrix = MatrixBytes(weights);
  const KvCacheDtype kv_dtype = HeldKvCacheDtype(
      settings().device, BackendOptions{.kv_cache_dtype = settings().kv_cache_dtype}, weights);
  const double kv_bytes = kv_dtype == KvCacheDtype::kF32 ? 4.0 : 2.0;
  StepWork work;
  // Per layer, always: q, k projections (matrices) and the routers (f32).
  const double qk = (H + G) * dh * d;
  double routers = 0;
  if (a.IsRouted()) routers += (G + H) * E * d;
  if (config.ffn.kind == FfnKind::kMoe) routers += X * d;
  // Dense attention: v and o too; dense FFN: both matrices.
  double dense = qk;
  if (!a.IsRouted()) dense += 2 * H * dh * d;
  if (config.ffn.kind == FfnKind::kDense) dense += 2 * F * d;
  work.flops += 2 * (dense + routers) * new_tokens * config.n_layers;
  work.bytes += (matrix * dense + 4 * routers) * config.n_layers;
  const RouterLayout layout(config);
  const std::vector<RouterId>& ids = layout.routers();
  for (size_t r = 0; r < ids.size(); ++r) {
    const RouterStepStats& stats = out.stats.routers[r];
    const double expert_params = ids[r].module == MoeModule::kFfn ? 2 * F * d : d * dh;
    for (size_t e = 0; e < stats.kept.size(); ++e) {
      work.flops += 2 * expert_params * stats.kept[e];
      if (stats.kept[e] > 0) work.bytes += matrix * expert_params;
    }
  }
  // Attention: q.k and p.v for every (query, key) pair and head; with XL
  // also q.R[i - j], reading one table row per head and distance.
  work.flops += 4.0 * H * dh * attended_pairs * config.n_layers;
  work.bytes += kv_bytes * 2 * G * dh * cached_tokens_read * config.n_layers;
  if (a.IsXl()) {
    work.flops += 2.0 * H * dh * attended_pairs * config.n_layers;
    work.bytes += 4.0 * H * dh * max_context * config.n_layers;
  }
  // Output head for the rows it ran on.
  work.flops += 2.0 * config.vocab_size * d * head_rows;
  work.bytes += matrix * config.vocab_size * d;
  return work;
}

// The limits right before a run of a timed loop: CPU only (a device's are
// not drifting with the host's load), and not --smoke.
std::optional<bench::MachineLimits> LimitsBefore() {
  if (settings().device != DeviceKind::kCpu || settings().smoke) return std::nullopt;
  return bench::MeasureMachineLimitsNow();
}

void Report(benchmark::State& state, const StepWork& work, int64_t tokens_per_step,
            const std::optional<bench::MachineLimits>& before) {
  const Limits& limits = MeasuredLimits();
  const double steps = static_cast<double>(state.iterations());
  if (before.has_value()) {
    const bench::MachineLimits after = bench::MeasureMachineLimitsNow();
    const double gb_per_s = std::max(before->read_gb_per_s, after.read_gb_per_s);
    const double gflops = std::max(before->sgemm_gflops, after.sgemm_gflops);
    const double roofline_s = std::max(work.bytes / 1e9 / gb_per_s, work.flops / 1e9 / gflops);
    state.counters["of_adjacent_roofline"] =
        benchmark::Counter(roofline_s * steps, benchmark::Counter::kIsRate);
    state.counters["adjacent_read_gb_per_s"] = gb_per_s;
    state.counters["adjacent_sgemm_gflops"] = gflops;
    // How the cores sat while the loop ran (bench/roofline.h): the larger
    // round trip of the two.
    state.counters["adjacent_round_trip_ns"] =
        std::max(before->core_round_trip_ns, after.core_round_trip_ns);
  }
  state.counters["tokens_per_s"] =
      benchmark::Counter(tokens_per_step * steps, benchmark::Counter::kIsRate);
  state.counters["gflops"] =
      benchmark::Counter(work.flops * steps / 1e9, benchmark::Counter::kIsRate);
  state.counters["gb_per_s"] =
      benchmark::Counter(work.bytes * steps / 1e9, benchmark::Counter::kIsRate);
  state.counters["gflops_of_peak"] =
      benchmark::Counter(work.flops * steps / 1e9 / limits.gflops, benchmark::Counter::kIsRate);
  state.counters["gb_per_s_of_peak"] =
      benchmark::Counter(work.bytes * steps / 1e9 / limits.gb_per_s, benchmark::Counter::kIsRate);
  // The roofline's time for one step over the measured one: 1 / (time per step).
  const double roofline_s =
      std::max(work.bytes / 1e9 / limits.gb_per_s, work.flops / 1e9 / limits.gflops);
  state.counters["of_roofline"] =
      benchmark::Counter(roofline_s * steps, benchmark::Counter::kIsRate);
  state.counters["step_gflop"] = work.flops / 1e9;
  state.counters["step_gb"] = work.bytes / 1e9;
  state.counters["machine_sgemm_gflops"] = limits.gflops;
  state.counters["machine_read_gb_per_s"] = limits.gb_per_s;
}

std::unique_ptr<Backend> NewBackend(const BenchModel& model) {
  absl::StatusOr<std::unique_ptr<Backend>> backend = CreateBackend(
      settings().device, model.config, model.weights, model.config.dispatch,
      BackendOptions{.num_threads = settings().threads,
                     .kv_cache_dtype = settings().kv_cache_dtype,
                     .cpu_weight_copies = settings().weight_copies,
                     .cpu_kernels = settings().kernel_isa,
                     .cuda_attention_segment_tokens = settings().attention_segment_tokens});
  return backend.ok() ? *std::move(backend) : nullptr;
}

// A continuous-batching step: `decoding` sequences holding `context` tokens
// each decode one, beside `prompts` new sequences whose whole prompts of
// `prompt_tokens` run as prefill chunks and sample their first token. Under
// a steady closed loop whose requests have drifted apart, most steps look
// like this (requests finish and arrive every step); a decode step of the
// same batch is its comparison (no prompts: DecodeStep). On the CUDA backend
// a decode step replays a captured graph, a step with prompts launches its
// kernels one by one. `temperature` > 0 (CUDA): every sequence draws its
// token (top_p 1, as a request that sets only the temperature), where the
// device sampler orders candidates, rather than greedy's argmax.
void MixedStep(benchmark::State& state, const std::string& name, const std::string& model_name,
               int decoding, int prompts, int prompt_tokens, int context, float temperature) {
  const BenchModel& model = Model(model_name);
  const int vocab = model.config.vocab_size;
  MeasuredLimits();
  std::unique_ptr<Backend> backend = NewBackend(model);
  if (backend == nullptr) {
    state.SkipWithError("backend creation failed");
    return;
  }
  const int block_size = 16;
  const auto blocks = [&](int tokens) { return (tokens + block_size - 1) / block_size; };
  KvCacheOptions cache;
  cache.block_size = block_size;
  cache.max_tokens = int64_t{block_size} * (int64_t{decoding} * blocks(context + 1) +
                                            int64_t{prompts} * blocks(prompt_tokens));
  absl::StatusOr<std::unique_ptr<KvCache>> kv_cache = KvCache::Create(backend.get(), cache);
  if (!kv_cache.ok()) {
    state.SkipWithError("KV cache setup failed");
    return;
  }
  KvBlockAllocator& allocator = (*kv_cache)->allocator();
  const int sequences = decoding + prompts;
  std::vector<std::vector<int32_t>> tokens(sequences);
  StepBatch prefill;
  prefill.Clear(block_size);
  for (int s = 0; s < sequences; ++s) {
    const int length = s < decoding ? context : prompt_tokens;
    if (!allocator.Reserve(s, s < decoding ? context + 1 : length).ok()) {
      state.SkipWithError("KV reserve failed");
      return;
    }
    for (int i = 0; i < length; ++i) tokens[s].push_back((s * 131 + i * 7) % vocab);
    if (s < decoding) prefill.Add(tokens[s], 0, allocator.BlockTable(s));
  }
  StepOutput out;
  if (!backend->Forward(prefill, &out).ok()) {
    state.SkipWithError("prefill failed");
    return;
  }
  // CPU: every sequence returns its logits (as the engine's step computed
  // them before sampling moved into the backend; the figures in
  // docs/performance.md). CUDA: a sample on the device (greedy unless
  // `temperature`), as the engine runs a step.
  SamplingParams sampling;
  sampling.temperature = temperature;
  std::vector<SamplerRng> rngs(sequences, SamplerRng(1));
  StepBatch step;
  step.Clear(block_size);
  std::vector<std::vector<int32_t>> next(decoding);
  for (int s = 0; s < sequences; ++s) {
    StepSequence* sequence = nullptr;
    if (s < decoding) {
      next[s] = {(s * 17 + 3) % vocab};
      sequence = &step.Add(next[s], context, allocator.BlockTable(s));
    } else {
      sequence = &step.Add(tokens[s], 0, allocator.BlockTable(s));
    }
    if (settings().device == DeviceKind::kCpu) {
      sequence->logits = LogitsMode::kLast;
    } else {
      sequence->sample = {&sampling, tokens[s], &rngs[s]};
    }
  }
  const std::optional<bench::MachineLimits> before = LimitsBefore();
  if (!TimedSteps(state, name, *backend, step, &out)) return;
  const int64_t new_tokens = decoding + int64_t{prompts} * prompt_tokens;
  const int64_t pairs = int64_t{decoding} * (context + 1) +
                        int64_t{prompts} * prompt_tokens * (prompt_tokens + 1) / 2;
  const int64_t read = int64_t{decoding} * (context + 1) + int64_t{prompts} * prompt_tokens;
  Report(state,
         MeasureWork(model.config, model.weights, out, new_tokens, pairs, read,
                     std::max(context + 1, prompt_tokens), sequences),
         new_tokens, before);
}

// A decode step for `batch` sequences that each hold `context` tokens.
void DecodeStep(benchmark::State& state, const std::string& name, const std::string& model_name,
                int batch, int context, float temperature) {
  MixedStep(state, name, model_name, batch, 0, 0, context, temperature);
}

// A prefill chunk of `length` tokens of one new sequence.
void PrefillChunk(benchmark::State& state, const std::string& name, const std::string& model_name,
                  int length) {
  const BenchModel& model = Model(model_name);
  const int vocab = model.config.vocab_size;
  MeasuredLimits();
  std::unique_ptr<Backend> backend = NewBackend(model);
  if (backend == nullptr) {
    state.SkipWithError("backend creation failed");
    return;
  }
  KvCacheOptions cache;
  cache.block_size = 16;
  cache.max_tokens = length;
  absl::StatusOr<std::unique_ptr<KvCache>> kv_cache = KvCache::Create(backend.get(), cache);
  if (!kv_cache.ok() || !(*kv_cache)->allocator().Reserve(0, length).ok()) {
    state.SkipWithError("cache setup failed");
    return;
  }
  std::vector<int32_t> tokens;
  for (int i = 0; i < length; ++i) tokens.push_back((i * 37 + 11) % vocab);
  StepBatch input;
  input.Clear(16);
  input.Add(tokens, 0, (*kv_cache)->allocator().BlockTable(0)).logits = LogitsMode::kLast;
  StepOutput out;
  const std::optional<bench::MachineLimits> before = LimitsBefore();
  if (!TimedSteps(state, name, *backend, input, &out)) return;
  const int64_t pairs = static_cast<int64_t>(length) * (length + 1) / 2;
  Report(state, MeasureWork(model.config, model.weights, out, length, pairs, length, length, 1),
         length, before);
}

void RegisterBenchmarks() {
  const bool cpu = settings().device == DeviceKind::kCpu;
  const bool smoke = settings().smoke;
  std::vector<std::string> models = {"switchall"};
  if (cpu) {
    models.push_back("switchall_bf16");
    models.push_back("switchall_xl");
  } else {
    models.push_back("dense");
  }
  std::vector<int> batches = cpu ? std::vector<int>{1, 8, 32} : std::vector<int>{1, 8, 32, 64, 256};
  int context = 128, prefill = cpu ? 512 : 2048;
  // Decode with long contexts too (batch 1 and 8): the attention that walks
  // them, which a 128-token context barely shows.
  std::vector<int> long_batches = {1, 8};
  int long_context = 2000;
  if (smoke) {
    batches = {1, 8};
    context = 16;
    prefill = 32;
    long_batches = {1};
    long_context = 100;
  }
  const auto add_decode = [](const std::string& model, int batch, int context_tokens,
                             float temperature = 0.0f) {
    std::string name = "decode/" + model + "/batch:" + std::to_string(batch) +
                       "/context:" + std::to_string(context_tokens);
    if (temperature > 0.0f) name += "/temperature:1";
    benchmark::RegisterBenchmark(name.c_str(), DecodeStep, name, model, batch, context_tokens,
                                 temperature)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  };
  // A step of 32 sequences in which 2 new ones run their prompts (GPU; the
  // shape of the paper-shaped serving runs in bench/compare_pytorch.py).
  const int mixed_prompts = 2, mixed_prompt_tokens = smoke ? 8 : 32;
  const int mixed_decoding = smoke ? 6 : 30;
  const auto add_mixed = [&](const std::string& model) {
    const std::string name = "mixed/" + model + "/decoding:" + std::to_string(mixed_decoding) +
                             "/prompts:" + std::to_string(mixed_prompts) + "x" +
                             std::to_string(mixed_prompt_tokens) +
                             "/context:" + std::to_string(context);
    benchmark::RegisterBenchmark(name.c_str(), MixedStep, name, model, mixed_decoding,
                                 mixed_prompts, mixed_prompt_tokens, context, 0.0f)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  };
  for (const std::string& model : models) {
    for (int batch : batches) add_decode(model, batch, context);
    if (!cpu) add_mixed(model);
    for (int batch : long_batches) add_decode(model, batch, long_context);
    // The device sampler's draw beside greedy's argmax, at the smallest and
    // the largest batch (CUDA; the CPU backend's steps return logits here).
    if (!cpu) {
      add_decode(model, batches.front(), context, 1.0f);
      add_decode(model, batches.back(), context, 1.0f);
    }
    const std::string name = "prefill/" + model + "/tokens:" + std::to_string(prefill);
    benchmark::RegisterBenchmark(name.c_str(), PrefillChunk, name, model, prefill)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  }
}

}  // namespace
}  // namespace switchserve

int main(int argc, char** argv) {
  using switchserve::settings;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--openblas-core") == 0) {
      const char* core = switchserve::bench::OpenBlasCoreToForceHere();
      std::printf("%s\n", core != nullptr ? core : "");
      return 0;
    }
  }
  switchserve::bench::UseThisCpusOpenBlasKernels(argv);
  // Our flags first; the rest are Google Benchmark's.
  std::vector<char*> rest = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--smoke") == 0) {
      settings().smoke = true;
    } else if (std::strncmp(argv[i], "--device=", 9) == 0) {
      absl::StatusOr<switchserve::DeviceKind> device = switchserve::ParseDeviceKind(argv[i] + 9);
      if (!device.ok() || *device == switchserve::DeviceKind::kAuto) {
        std::fprintf(stderr, "engine_bench: --device: expected cpu or cuda\n");
        return 2;
      }
      settings().device = *device;
    } else if (std::strncmp(argv[i], "--kv-cache-dtype=", 17) == 0) {
      absl::StatusOr<switchserve::KvCacheDtype> dtype =
          switchserve::ParseKvCacheDtype(argv[i] + 17);
      if (!dtype.ok()) {
        std::fprintf(stderr, "engine_bench: --kv-cache-dtype: expected auto, f32 or bf16\n");
        return 2;
      }
      settings().kv_cache_dtype = *dtype;
    } else if (std::strncmp(argv[i], "--kernel-isa=", 13) == 0) {
      absl::StatusOr<switchserve::cpu::KernelIsa> isa =
          switchserve::cpu::ParseKernelIsa(argv[i] + 13);
      if (!isa.ok() || !switchserve::cpu::CpuSupports(*isa)) {
        std::fprintf(stderr, "engine_bench: --kernel-isa: %s\n",
                     isa.ok() ? "this CPU cannot run that build"
                              : std::string(isa.status().message()).c_str());
        return 2;
      }
      settings().kernel_isa = *isa;
    } else if (std::strncmp(argv[i], "--threads=", 10) == 0) {
      if (!absl::SimpleAtoi(argv[i] + 10, &settings().threads) || settings().threads < 1) {
        std::fprintf(stderr, "engine_bench: --threads: expected a positive count\n");
        return 2;
      }
    } else if (std::strncmp(argv[i], "--pool-timeline=", 16) == 0) {
      settings().pool_timeline = argv[i] + 16;
      if (settings().pool_timeline.empty()) {
        std::fprintf(stderr, "engine_bench: --pool-timeline: expected a file\n");
        return 2;
      }
    } else if (std::strncmp(argv[i], "--weight-copies=", 16) == 0) {
      const std::string value = argv[i] + 16;
      if (value != "0" && value != "1") {
        std::fprintf(stderr, "engine_bench: --weight-copies: expected 0 or 1\n");
        return 2;
      }
      settings().weight_copies = value == "1";
    } else if (std::strncmp(argv[i], "--attention-segment-tokens=", 27) == 0) {
      if (!absl::SimpleAtoi(argv[i] + 27, &settings().attention_segment_tokens) ||
          settings().attention_segment_tokens < 1) {
        std::fprintf(stderr,
                     "engine_bench: --attention-segment-tokens: expected a positive count\n");
        return 2;
      }
    } else {
      rest.push_back(argv[i]);
    }
  }
  int rest_argc = static_cast<int>(rest.size());
  benchmark::Initialize(&rest_argc, rest.data());
  if (benchmark::ReportUnrecognizedArguments(rest_argc, rest.data())) return 2;
  switchserve::RegisterBenchmarks();
  switchserve::MeasuredLimits();  // before the run: its context records them
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
