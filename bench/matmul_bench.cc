// The CPU backend's matmul kernels (kernels/cpu/matmul.h) on the shapes of the
// paper's 262M SwitchAll model, against OpenBLAS on the same f32 problems
// (sgemv for a few rows, as the backend called it, sgemm above), one thread.
// What batch invariance costs at the kernel level, and what half-precision
// weights save.
//
// Counters: gflops (2 m n k per call), gb_per_s (weight bytes read per call;
// the weights are larger than the caches only for the output head, so the
// others measure the kernel, not DRAM).
//
// BM_MatmulFromMemory runs m rows (1: decode at batch 1; 4: what one expert
// of the MoE FFN gets in a batch-32 step) against one weight matrix
// after another, 256 MiB of them, on all cores through the MatmulRunner as a
// decode step does: every weight comes from memory. `matrices` is how many
// the runner gets at once (a batch-1 step of the paper's shape: 8 value or
// output experts, 2 of 4 in each of 4 heads; 4 of the 32 FFN experts; a
// batch-32 step: all 32 FFN experts). of_read_bandwidth is its
// weight bytes per second over the machine's read bandwidth measured in the
// same process (bench/roofline.h). huge_pages: the 256 MiB on 2 MiB pages,
// as the model's weight tensors are held (engine/model/huge_pages.h), or
// on 4 KiB pages (0); --benchmark_enable_random_interleaving with
// repetitions alternates the two. tiled: the weights in the tiled layout the
// CPU backend holds a copy in for one-row products (kernels/cpu/matmul.h:
// row blocks rows out, column panels rows in), or row-major as stored (0);
// on huge pages.
//
// BM_RunnerMatmul runs a 512-token prefill's products whole on all cores:
// ours through the MatmulRunner (64-row pieces on the worker pool, as the
// engine runs them), OpenBLAS's sgemm with as many threads on f32 copies:
// what sgemm itself reaches on these shapes, against the 2048^3 limit the
// engine's benchmarks measure.
//
// BM_PagedAttentionPrefill: the paper shape's attention over a prefill chunk
// (scores, softmax, value reduction; PagedAttention) on one or two threads.
//
// BM_NormRows, BM_AddExpertOutputs: the elementwise work around a prefill's
// products (norms, each token's expert rows added to its row).
//
// BM_WorkerPoolJob: what one job of the worker pool costs, empty or with
// small pieces, on all cores.
//
// BM_GatedExpertOutputs runs a module's expert products whose rows go back
// into the tokens' rows, scaled by their gates, for a step of `tokens`
// tokens routed at random, bf16 weights from memory (256 MiB of copies on
// huge pages), on all cores: the paper shape's SwitchHead output experts (4
// heads x 4 experts, top 2, [112, 1024] rows in) or its FFN down
// projections (32 experts, top 4, [1024, 128] rows out). fused 0: every
// product whole (MatmulRunner), then AddExpertOutputs; 1:
// GatedExpertProducts (a block of columns and tokens at a time where the
// experts average over 32 rows, else the same as 0). Same bits.
//
//   build/release/bench/matmul_bench --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>
#include <cblas.h>

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "bench/roofline.h"
#include "engine/model/huge_pages.h"
#include "engine/moe/expert_dispatch.h"
#include "kernels/cpu/cpu_ops.h"
#include "kernels/cpu/gated_expert_products.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/matmul_runner.h"
#include "kernels/cpu/paged_attention.h"
#include "kernels/cpu/worker_pool.h"

namespace switchserve::cpu {
namespace {

enum Op { kOurs = 0, kOpenBlas = 1 };

struct Problem {
  Tensor w;
  std::vector<float> a, c;
};

Problem MakeProblem(int m, int n, int k, DType dtype) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> w(static_cast<size_t>(n) * k);
  for (float& x : w) x = dist(rng);
  Problem p;
  p.w = Tensor::F32({n, k}, std::move(w)).ConvertedTo(dtype);
  p.a.resize(static_cast<size_t>(m) * k);
  for (float& x : p.a) x = dist(rng);
  p.c.resize(static_cast<size_t>(m) * n);
  return p;
}

// One product of BM_Matmul or BM_RunnerMatmul. Args: m, n, k, layout (0 rows
// out, 1 rows in), dtype (0 f32, 1 bf16), op.
struct MatmulCase {
  explicit MatmulCase(const benchmark::State& state)
      : m(static_cast<int>(state.range(0))),
        n(static_cast<int>(state.range(1))),
        k(static_cast<int>(state.range(2))),
        rows_in(state.range(3) == 1),
        dtype(state.range(4) == 1 ? DType::kBF16 : DType::kF32),
        blas(state.range(5) == kOpenBlas) {}

  // False, and the benchmark skipped, for OpenBLAS with half-precision weights.
  bool Runnable(benchmark::State& state) const {
    if (blas && dtype != DType::kF32) state.SkipWithError("OpenBLAS runs f32 weights only");
    return !blas || dtype == DType::kF32;
  }
  // Rows in: W is [k, n] (the same bytes, read as k rows of n).
  MatmulArgs Args(Problem& p) const {
    return {m, n, k, p.a.data(), k, nullptr, MatrixOf(p.w, rows_in ? n : k), p.c.data(), n};
  }
  void Sgemm(Problem& p) const {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, rows_in ? CblasNoTrans : CblasTrans, m, n, k, 1.0f,
                p.a.data(), k, p.w.f32(), rows_in ? n : k, 0.0f, p.c.data(), n);
  }
  void CountFlops(benchmark::State& state) const {
    state.counters["gflops"] = benchmark::Counter(
        2e-9 * m * n * k * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
  }

  int m, n, k;
  bool rows_in;
  DType dtype;
  bool blas;
};

// The whole product on all cores: ours through MatmulRunner (pieces on the
// worker pool, as a prefill's products run), OpenBLAS's sgemm with as many
// threads.
void BM_RunnerMatmul(benchmark::State& state) {
  const MatmulCase mc(state);
  if (!mc.Runnable(state)) return;
  const int threads = static_cast<int>(std::thread::hardware_concurrency());
  openblas_set_num_threads(threads);
  Problem p = MakeProblem(mc.m, mc.n, mc.k, mc.dtype);
  WorkerPool pool(threads);
  MatmulRunner runner(BestKernelIsa(), &pool);
  const MatmulArgs args = mc.Args(p);
  for (auto _ : state) {
    if (mc.blas) {
      mc.Sgemm(p);
    } else {
      runner.Run(mc.rows_in ? WeightLayout::kRowsIn : WeightLayout::kRowsOut, args);
    }
    benchmark::DoNotOptimize(p.c.data());
  }
  openblas_set_num_threads(1);
  mc.CountFlops(state);
}
// A 512-token prefill's q projection and FFN up and down projections (rows
// out), its value and output experts (rows in).
BENCHMARK(BM_RunnerMatmul)
    ->ArgNames({"m", "n", "k", "rows_in", "bf16", "blas"})
    ->Args({512, 448, 1024, 0, 1, kOurs})
    ->Args({512, 448, 1024, 0, 0, kOpenBlas})
    ->Args({128, 128, 1024, 0, 1, kOurs})
    ->Args({128, 128, 1024, 0, 0, kOpenBlas})
    ->Args({128, 1024, 128, 0, 1, kOurs})
    ->Args({128, 1024, 128, 0, 0, kOpenBlas})
    ->Args({256, 112, 1024, 1, 1, kOurs})
    ->Args({256, 112, 1024, 1, 0, kOpenBlas})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// One thread.
void BM_Matmul(benchmark::State& state) {
  const MatmulCase mc(state);
  if (!mc.Runnable(state)) return;
  const int m = mc.m, n = mc.n, k = mc.k;
  openblas_set_num_threads(1);
  Problem p = MakeProblem(m, n, k, mc.dtype);
  const MatmulKernels& kernels = KernelsFor(BestKernelIsa());
  const MatmulArgs args = mc.Args(p);
  for (auto _ : state) {
    if (!mc.blas) {
      (mc.rows_in ? kernels.rows_in : kernels.rows_out)(args);
    } else if (m <= 4) {
      for (int r = 0; r < m; ++r) {
        if (mc.rows_in) {
          cblas_sgemv(CblasRowMajor, CblasTrans, k, n, 1.0f, p.w.f32(), n, p.a.data() + r * k, 1,
                      0.0f, p.c.data() + r * n, 1);
        } else {
          cblas_sgemv(CblasRowMajor, CblasNoTrans, n, k, 1.0f, p.w.f32(), k, p.a.data() + r * k, 1,
                      0.0f, p.c.data() + r * n, 1);
        }
      }
    } else {
      mc.Sgemm(p);
    }
    benchmark::DoNotOptimize(p.c.data());
  }
  mc.CountFlops(state);
  state.counters["gb_per_s"] = benchmark::Counter(
      static_cast<double>(p.w.bytes()) * static_cast<double>(state.iterations()) / 1e9,
      benchmark::Counter::kIsRate);
}

void Shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"m", "n", "k", "rows_in", "bf16", "blas"});
  struct Shape {
    int n, k, rows_in;
    int min_m = 1;
  };
  // q projection, FFN expert up and down, SwitchHead value and output experts,
  // the output head; then the first three held transposed ([k, n], rows in):
  // what their products of many rows would cost as chains of fused
  // multiply-adds (their one-row products are in BM_MatmulFromMemory). Last,
  // the built-in model's FFN down projection (d_ff 28): k is no multiple of
  // 8, so every tile ends in partial vectors.
  const Shape shapes[] = {
      {448, 1024, 0},  {128, 1024, 0},     {1024, 128, 0},     {112, 1024, 1},     {1024, 112, 1},
      {8000, 1024, 0}, {448, 1024, 1, 32}, {128, 1024, 1, 32}, {1024, 128, 1, 32}, {128, 28, 0}};
  for (const Shape& s : shapes) {
    for (int m : {1, 4, 16, 32, 256}) {
      if (m < s.min_m || (s.n == 8000 && m > 32)) continue;
      b->Args({m, s.n, s.k, s.rows_in, 0, kOurs});
      b->Args({m, s.n, s.k, s.rows_in, 1, kOurs});
      b->Args({m, s.n, s.k, s.rows_in, 0, kOpenBlas});
    }
  }
}
BENCHMARK(BM_Matmul)->Apply(Shapes)->Unit(benchmark::kMicrosecond);

// `bytes` (>= kHugePageBytes) on 2 MiB pages, as the model's weight tensors
// are held, or on the heap's 4 KiB pages.
std::shared_ptr<std::byte[]> PagedBytes(size_t bytes, bool huge_pages) {
  if (!huge_pages) return std::shared_ptr<std::byte[]>(new std::byte[bytes]);
  return std::shared_ptr<std::byte[]>(static_cast<std::byte*>(AllocateHugePageBytes(bytes)),
                                      [bytes](std::byte* p) { FreeHugePageBytes(p, bytes); });
}

// Args: n, k, layout (0 rows out, 1 rows in), dtype (0 f32, 1 bf16), m,
// matrices, huge pages (0, 1), tiled (0, 1).
void BM_MatmulFromMemory(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0)), k = static_cast<int>(state.range(1));
  const bool rows_in = state.range(2) == 1;
  const DType dtype = state.range(3) == 1 ? DType::kBF16 : DType::kF32;
  const int m = static_cast<int>(state.range(4));
  const int matrices = static_cast<int>(state.range(5));
  const double read_gb_per_s = bench::MeasureMachineLimits().read_gb_per_s;
  const Problem one = MakeProblem(m, n, k, dtype);
  const bool tiled = state.range(7) == 1;
  // MakeProblem's [n, k] values as the [k, n] matrix a rows-in product reads.
  Tensor as_read = one.w;
  if (rows_in) as_read.mutable_shape() = {k, n};
  const TiledWeights tiled_one =
      tiled ? TiledWeights(as_read, rows_in ? Tiling::kColumnPanels : Tiling::kRowBlocks)
            : TiledWeights();
  const WeightMatrix stored = tiled ? tiled_one.Matrix() : MatrixOf(one.w, rows_in ? n : k);
  const size_t bytes_per = static_cast<size_t>(tiled ? tiled_one.bytes() : one.w.bytes());
  const int copies = static_cast<int>(std::max<int64_t>(
      2 * matrices, (int64_t{256} << 20) / static_cast<int64_t>(bytes_per) / matrices * matrices));
  // The copies one after another, on huge pages or not.
  const std::shared_ptr<std::byte[]> copies_memory =
      PagedBytes(bytes_per * copies, state.range(6) == 1);
  std::byte* const copies_data = copies_memory.get();
  for (int i = 0; i < copies; ++i) std::memcpy(copies_data + bytes_per * i, stored.data, bytes_per);
  std::vector<float> a = one.a, c(static_cast<size_t>(m) * n * matrices);
  WorkerPool pool(static_cast<int>(std::thread::hardware_concurrency()));
  MatmulRunner runner(BestKernelIsa(), &pool);
  const WeightLayout layout = rows_in ? WeightLayout::kRowsIn : WeightLayout::kRowsOut;
  std::vector<MatmulTask> tasks(matrices);
  int next = 0;
  for (auto _ : state) {
    for (int i = 0; i < matrices; ++i) {
      WeightMatrix w = stored;
      w.data = copies_data + bytes_per * (next + i);
      tasks[i] = {layout,
                  {m, n, k, a.data(), k, nullptr, w, c.data() + static_cast<size_t>(i) * m * n, n}};
    }
    runner.Run(tasks);
    benchmark::DoNotOptimize(c.data());
    next = next + matrices == copies ? 0 : next + matrices;
  }
  const double bytes =
      static_cast<double>(one.w.bytes()) * matrices * static_cast<double>(state.iterations());
  state.counters["gb_per_s"] = benchmark::Counter(bytes / 1e9, benchmark::Counter::kIsRate);
  state.counters["of_read_bandwidth"] =
      benchmark::Counter(bytes / 1e9 / read_gb_per_s, benchmark::Counter::kIsRate);
  state.counters["gflops"] =
      benchmark::Counter(2e-9 * m * n * k * matrices * static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate);
}

void FromMemoryShapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"n", "k", "rows_in", "bf16", "m", "matrices", "huge_pages", "tiled"});
  // Every shape on 2 MiB pages and on 4 KiB pages, and tiled on 2 MiB pages.
  const auto args = [b](std::vector<int64_t> shape) {
    for (const auto& [huge, tiled] : {std::array<int64_t, 2>{1, 0}, {0, 0}, {1, 1}}) {
      shape.push_back(huge);
      shape.push_back(tiled);
      b->Args(shape);
      shape.resize(shape.size() - 2);
    }
  };
  for (const auto& [n, k, rows_in] : {std::array<int, 3>{448, 1024, 0},
                                      {128, 1024, 0},
                                      {1024, 128, 0},
                                      {112, 1024, 1},
                                      {1024, 112, 1},
                                      {8000, 1024, 0}}) {
    for (int bf16 : {0, 1}) {
      for (int m : {1, 4}) args({n, k, rows_in, bf16, m, 1});
      // What a step gives the runner at once: at batch 1, 8 value or output
      // experts, or 4 FFN experts; at batch 32, all 16 value or output
      // experts of about 16 rows each, or all 32 FFN experts of about 4 rows
      // each (routing gives some twice that).
      if (rows_in == 1) {
        args({n, k, rows_in, bf16, 1, 8});
        args({n, k, rows_in, bf16, 16, 16});
      }
      if (n * k == 128 * 1024) {
        args({n, k, rows_in, bf16, 1, 4});
        for (int rows : {4, 8}) args({n, k, rows_in, bf16, rows, 32});
      }
    }
  }
  // The q projection and the FFN experts held transposed ([k, n], rows in).
  for (const auto& [n, k] : {std::array<int, 2>{448, 1024}, {128, 1024}, {1024, 128}}) {
    for (int bf16 : {0, 1}) {
      args({n, k, 1, bf16, 1, 1});
      if (n != 448) {
        args({n, k, 1, bf16, 1, 4});
        args({n, k, 1, bf16, 4, 32});
      }
    }
  }
}
BENCHMARK(BM_MatmulFromMemory)
    ->Apply(FromMemoryShapes)
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// `groups` routers' assignments of `tokens` tokens, each to top_k distinct
// experts of `experts` at random, every gate 0.5.
std::vector<ExpertAssignments> RandomAssignments(int groups, int experts, int top_k, int tokens,
                                                 std::mt19937& rng) {
  std::vector<ExpertAssignments> assignments(groups);
  for (ExpertAssignments& as : assignments) {
    std::vector<std::vector<int>> chosen(experts);
    for (int t = 0; t < tokens; ++t) {
      std::vector<int> order(experts);
      for (int e = 0; e < experts; ++e) order[e] = e;
      std::shuffle(order.begin(), order.end(), rng);
      for (int r = 0; r < top_k; ++r) chosen[order[r]].push_back(t);
    }
    as.n_experts = experts;
    as.offsets.assign(experts + 1, 0);
    for (int e = 0; e < experts; ++e) {
      as.offsets[e + 1] = as.offsets[e] + static_cast<int32_t>(chosen[e].size());
      as.token.insert(as.token.end(), chosen[e].begin(), chosen[e].end());
    }
    as.weight.assign(as.token.size(), 0.5f);
  }
  return assignments;
}

// Args: module (0 SwitchHead output experts, 1 FFN down projections), tokens,
// fused (0, 1).
void BM_GatedExpertOutputs(benchmark::State& state) {
  const bool ffn = state.range(0) == 1;
  const int tokens = static_cast<int>(state.range(1));
  const bool fused = state.range(2) == 1;
  const int groups = ffn ? 1 : 4, experts = ffn ? 32 : 4, top_k = ffn ? 4 : 2;
  const int n = 1024, k = ffn ? 128 : 112;
  const WeightLayout layout = ffn ? WeightLayout::kRowsOut : WeightLayout::kRowsIn;
  std::mt19937 rng(7);
  const std::vector<ExpertAssignments> assignments =
      RandomAssignments(groups, experts, top_k, tokens, rng);
  const int64_t slots = static_cast<int64_t>(tokens) * top_k * groups;
  // Rows in: the tokens' attention outputs [tokens, groups * k]; rows out:
  // the slots' hidden rows [slots, k].
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> a(ffn ? slots * k : static_cast<int64_t>(tokens) * groups * k);
  for (float& x : a) x = dist(rng);
  const Problem one = MakeProblem(1, n, k, DType::kBF16);
  const size_t bytes_per = static_cast<size_t>(one.w.bytes());
  const int per_step = groups * experts;
  const int copies =
      static_cast<int>(std::max<int64_t>(2, (int64_t{256} << 20) / bytes_per / per_step)) *
      per_step;
  const std::shared_ptr<std::byte[]> memory = PagedBytes(bytes_per * copies, true);
  for (int i = 0; i < copies; ++i)
    std::memcpy(memory.get() + bytes_per * i, one.w.raw(), bytes_per);
  std::vector<float> x(static_cast<size_t>(tokens) * n, 0.0f), product(slots * n);
  WorkerPool pool(static_cast<int>(std::thread::hardware_concurrency()));
  MatmulRunner runner(BestKernelIsa(), &pool);
  GatedExpertProducts gated(&runner, &pool);
  std::vector<MatmulTask> tasks;
  std::vector<GatedExpertTask> gated_tasks;
  std::vector<ExpertOutputs> outputs;
  int next = 0;
  for (auto _ : state) {
    tasks.clear();
    gated_tasks.clear();
    outputs.clear();
    int64_t base = 0;
    for (int g = 0; g < groups; ++g) {
      const ExpertAssignments& as = assignments[g];
      for (int e = 0; e < experts; ++e) {
        const WeightMatrix w{DType::kBF16, memory.get() + bytes_per * (next + g * experts + e),
                             ffn ? k : n};
        MatmulArgs args{as.count(e),
                        n,
                        k,
                        nullptr,
                        k,
                        nullptr,
                        w,
                        product.data() + (base + as.begin(e)) * n,
                        n};
        if (ffn) {
          args.a = a.data() + (base + as.begin(e)) * k;
        } else {
          args.a = a.data() + static_cast<int64_t>(g) * k;
          args.lda = static_cast<int64_t>(groups) * k;
          args.a_rows = as.token.data() + as.begin(e);
        }
        tasks.push_back({layout, args});
        gated_tasks.push_back({{layout, args}, &as, e});
      }
      outputs.push_back({&as, product.data() + base * n, x.data(), n});
      base += as.offsets[experts];
    }
    if (fused) {
      gated.Run(gated_tasks, n, tokens, x.data(), n);
    } else {
      runner.Run(tasks);
      AddExpertOutputs(outputs, n, tokens, &pool, runner.parallel_min_macs());
    }
    benchmark::DoNotOptimize(x.data());
    next = next + per_step == copies ? 0 : next + per_step;
  }
  state.counters["gflops"] = benchmark::Counter(
      2e-9 * static_cast<double>(slots) * n * k * static_cast<double>(state.iterations()),
      benchmark::Counter::kIsRate);
}
BENCHMARK(BM_GatedExpertOutputs)
    ->ArgNames({"module", "tokens", "fused"})
    ->ArgsProduct({{0, 1}, {1, 32, 512}, {0, 1}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// Args: tokens (a prefill chunk of one sequence from position 0), kv_bf16
// (0 f32, 1 bf16 cache), threads (the worker pool's). The paper shape's
// attention (4 heads of 112 channels, RoPE, one value a KV head) over a
// paged cache of 16-row blocks: scores, softmax and the value reduction of a prefill's
// attention job. gflops counts 4 H dh per (query, visible key) pair.
void BM_PagedAttentionPrefill(benchmark::State& state) {
  const int tokens = static_cast<int>(state.range(0));
  const DType kv_dtype = state.range(1) == 1 ? DType::kBF16 : DType::kF32;
  const int threads = static_cast<int>(state.range(2));
  // What attention proper reads of the paper shape's SwitchHead (source
  // value routing: one cached value a KV head, as the default config has).
  AttentionConfig config;
  config.n_heads = 4;
  config.n_kv_heads = 4;
  config.head_dim = 112;
  const int H = config.n_heads, dh = config.head_dim;
  constexpr int kBlockSize = 16;
  const int blocks = (tokens + kBlockSize - 1) / kBlockSize;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  const auto random_tensor = [&](int64_t rows, int64_t cols) {
    std::vector<float> x(static_cast<size_t>(rows * cols));
    for (float& v : x) v = dist(rng);
    return Tensor::F32({rows, cols}, std::move(x)).ConvertedTo(kv_dtype);
  };
  // Blocks in reverse order in the cache, as a table need not be ordered.
  Tensor k = random_tensor(int64_t{blocks} * kBlockSize, int64_t{H} * dh);
  Tensor v = random_tensor(int64_t{blocks} * kBlockSize, int64_t{H} * dh);
  std::vector<int32_t> table(blocks);
  for (int b = 0; b < blocks; ++b) table[b] = blocks - 1 - b;
  StepBatch step;
  step.Clear(kBlockSize);
  step.Add(std::vector<int32_t>(tokens, 1), 0, table);
  std::vector<float> q(static_cast<size_t>(tokens) * H * dh), a(q.size());
  for (float& x : q) x = dist(rng);
  WorkerPool pool(threads);
  PagedAttention attention(config, BestKernelIsa(), &pool, /*parallel_min_macs=*/0);
  // Attention only reads the cache.
  const KvLayerCache cache{kv_dtype, const_cast<void*>(k.raw()), const_cast<void*>(v.raw())};
  for (auto _ : state) {
    attention.Run(step, q.data(), cache, XlPositionKeys{}, /*value_gates=*/nullptr, a.data());
    benchmark::DoNotOptimize(a.data());
  }
  const double pairs = 0.5 * tokens * (tokens + 1.0);
  state.counters["gflops"] = benchmark::Counter(
      4e-9 * H * dh * pairs * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_PagedAttentionPrefill)
    ->ArgNames({"tokens", "kv_bf16", "threads"})
    ->ArgsProduct({{512}, {0, 1}, {1, 2}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// The elementwise work around a prefill's products, on all cores, as the
// engine calls it. BM_NormRows: LayerNorm (weight and bias) of `rows` rows of
// the paper shape's 1024 channels. BM_AddExpertOutputs: each token's expert
// rows added to its row, scaled by their gates, for `tokens` tokens routed at
// random: the paper shape's value experts (module 0: 4 routers of 4 experts,
// top 2, 112 channels each into the token's 448) or its FFN (1: 32
// experts, top 4, 1024 channels onto the residual). gb_per_s counts the bytes
// read and written once.
void BM_NormRows(benchmark::State& state) {
  const int rows = static_cast<int>(state.range(0));
  constexpr int kD = 1024;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(rows) * kD), weight(kD), bias(kD), out(x.size());
  for (float& v : x) v = dist(rng);
  for (float& v : weight) v = dist(rng);
  for (float& v : bias) v = dist(rng);
  WorkerPool pool(static_cast<int>(std::thread::hardware_concurrency()));
  MatmulRunner runner(BestKernelIsa(), &pool);
  for (auto _ : state) {
    NormRows(NormKind::kLayerNorm, 1e-5f, x.data(), rows, kD, weight.data(), bias.data(),
             out.data(), &pool, runner.parallel_min_macs());
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["gb_per_s"] = benchmark::Counter(
      8e-9 * rows * kD * static_cast<double>(state.iterations()), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_NormRows)
    ->ArgNames({"rows"})
    ->ArgsProduct({{32, 512}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

void BM_AddExpertOutputs(benchmark::State& state) {
  const bool ffn = state.range(0) == 1;
  const int tokens = static_cast<int>(state.range(1));
  const int groups = ffn ? 1 : 4, experts = ffn ? 32 : 4, top_k = ffn ? 4 : 2;
  const int width = ffn ? 1024 : 112, row = width * groups;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<ExpertAssignments> assignments =
      RandomAssignments(groups, experts, top_k, tokens, rng);
  for (ExpertAssignments& as : assignments) {
    for (float& w : as.weight) w = dist(rng);
  }
  const int64_t slots = static_cast<int64_t>(tokens) * top_k;
  std::vector<float> product(static_cast<size_t>(slots * groups * width));
  for (float& v : product) v = dist(rng);
  std::vector<float> x(static_cast<size_t>(tokens) * row, 0.0f);
  std::vector<ExpertOutputs> outputs;
  for (int g = 0; g < groups; ++g) {
    outputs.push_back({&assignments[g], product.data() + g * slots * width,
                       x.data() + static_cast<int64_t>(g) * width, row});
  }
  WorkerPool pool(static_cast<int>(std::thread::hardware_concurrency()));
  MatmulRunner runner(BestKernelIsa(), &pool);
  for (auto _ : state) {
    AddExpertOutputs(outputs, width, tokens, &pool, runner.parallel_min_macs());
    benchmark::DoNotOptimize(x.data());
  }
  state.counters["gb_per_s"] =
      benchmark::Counter(4e-9 * static_cast<double>(product.size() + 2 * x.size()) *
                             static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate);
}
BENCHMARK(BM_AddExpertOutputs)
    ->ArgNames({"module", "tokens"})
    ->ArgsProduct({{0, 1}, {32, 512}})
    ->Unit(benchmark::kMicrosecond)
    ->UseRealTime();

// One job of the worker pool on all cores: `pieces` pieces that each sum
// `floats` floats of a 256 KiB buffer (0: empty pieces, the job's own cost).
// round_trip_ns: the cores' cache-line round trip measured after the loop
// (bench/roofline.h), which says how far apart the cores sat.
void BM_WorkerPoolJob(benchmark::State& state) {
  const int pieces = static_cast<int>(state.range(0));
  const int floats = static_cast<int>(state.range(1));
  WorkerPool pool(static_cast<int>(std::thread::hardware_concurrency()));
  std::vector<float> data(size_t{1} << 16, 1.0f);
  std::vector<float> sums(static_cast<size_t>(pieces));
  for (auto _ : state) {
    pool.Run(pieces, [&](int i, int) {
      float sum = 0;
      for (int j = 0; j < floats; ++j) sum += data[(static_cast<size_t>(i) * floats + j) & 0xffff];
      sums[i] = sum;
    });
    benchmark::DoNotOptimize(sums.data());
  }
  state.counters["round_trip_ns"] = bench::MeasureCoreRoundTripNs();
}
BENCHMARK(BM_WorkerPoolJob)
    ->ArgNames({"pieces", "floats"})
    ->ArgsProduct({{2, 8, 32}, {0, 2048}})
    ->Unit(benchmark::kNanosecond)
    ->UseRealTime();

}  // namespace
}  // namespace switchserve::cpu

int main(int argc, char** argv) {
  // blas:1 runs OpenBLAS's kernels for this CPU (its widest where OpenBLAS's
  // detection falls back, bench/roofline.h), or those OPENBLAS_CORETYPE names.
  switchserve::bench::UseThisCpusOpenBlasKernels(argv);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("blas_kernels", switchserve::bench::SgemmKernels());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
