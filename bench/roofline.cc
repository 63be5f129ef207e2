#include "bench/roofline.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "engine/model/huge_pages.h"

namespace switchserve::bench {
namespace {

double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The buffers both measurements use, allocated and filled once per process.
struct Buffers {
  static constexpr int kGemm = 2048;
  std::vector<float> a, b, c;
  // 1 GiB, much larger than the caches, on huge pages as the model's weights
  // and the KV cache are held (engine/model/huge_pages.h): on 4 KiB pages the
  // same passes read 8-10% slower on an AMD EPYC VM, and the limit would
  // understate what the weights' memory delivers.
  HugePageVector<float> stream;
};

Buffers& TheBuffers() {
  static Buffers* buffers = [] {
    auto* b = new Buffers();
    const size_t gemm = static_cast<size_t>(Buffers::kGemm) * Buffers::kGemm;
    b->a.assign(gemm, 0.5f);
    b->b.assign(gemm, 0.25f);
    b->c.assign(gemm, 0.0f);
    b->stream.resize((size_t{1} << 30) / sizeof(float));
    float* data = b->stream.data();
    const size_t count = b->stream.size();
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < count; ++i) data[i] = static_cast<float>(i & 7);
    return b;
  }();
  return *buffers;
}

// Best of `reps` 2048^3 sgemm calls, on all threads (the CPU backend sets
// OpenBLAS to one thread; that is restored after).
double MeasureSgemm(int reps) {
  Buffers& m = TheBuffers();
  constexpr int n = Buffers::kGemm;
  const int threads = openblas_get_num_threads();
  openblas_set_num_threads(omp_get_max_threads());
  double best = 1e30;
  for (int rep = 0; rep < reps; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, m.a.data(), n, m.b.data(),
                n, 0.0f, m.c.data(), n);
    best = std::min(best, Seconds(start));
  }
  openblas_set_num_threads(threads);
  return 2.0 * n * n * static_cast<double>(n) / best / 1e9;
}

// Best of `reps` passes over the 1 GiB buffer.
double MeasureReadBandwidth(int reps) {
  const HugePageVector<float>& data = TheBuffers().stream;
  const size_t count = data.size();
  // 32 independent accumulators per thread: a single float sum is bound by
  // the add latency (a few GB/s), not by memory.
  constexpr size_t kLanes = 32;
  double best = 1e30;
  volatile float sink = 0;
  for (int rep = 0; rep < reps; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    float total = 0;
#pragma omp parallel reduction(+ : total)
    {
      float lanes[kLanes] = {};
#pragma omp for schedule(static)
      for (size_t block = 0; block < count / kLanes; ++block) {
        const float* p = data.data() + block * kLanes;
        for (size_t j = 0; j < kLanes; ++j) lanes[j] += p[j];
      }
      for (float lane : lanes) total += lane;
    }
    best = std::min(best, Seconds(start));
    sink = sink + total;
  }
  return static_cast<double>(count * sizeof(float)) / best / 1e9;
}

}  // namespace

const MachineLimits& MeasureMachineLimits() {
  static const MachineLimits limits = [] {
    MachineLimits measured;
    measured.sgemm_gflops = MeasureSgemm(4);
    measured.read_gb_per_s = MeasureReadBandwidth(5);
    std::fprintf(stderr, "machine limits: sgemm %.1f GFLOP/s, memory read %.1f GB/s (%d threads)\n",
                 measured.sgemm_gflops, measured.read_gb_per_s, omp_get_max_threads());
    return measured;
  }();
  return limits;
}

MachineLimits MeasureMachineLimitsNow() {
  MachineLimits measured;
  measured.sgemm_gflops = MeasureSgemm(2);
  measured.read_gb_per_s = MeasureReadBandwidth(3);
  return measured;
}

}  // namespace switchserve::bench
