#include "bench/roofline.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

namespace switchserve::bench {
namespace {

double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double MeasureSgemm() {
  constexpr int n = 2048;
  std::vector<float> a(static_cast<size_t>(n) * n, 0.5f), b(a.size(), 0.25f), c(a.size());
  double best = 1e30;
  for (int rep = 0; rep < 4; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a.data(), n, b.data(), n,
                0.0f, c.data(), n);
    best = std::min(best, Seconds(start));
  }
  return 2.0 * n * n * static_cast<double>(n) / best / 1e9;
}

double MeasureReadBandwidth() {
  const size_t count = (size_t{1} << 30) / sizeof(float);
  std::vector<float> data(count);
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < count; ++i) data[i] = static_cast<float>(i & 7);
  // 32 independent accumulators per thread: a single float sum is bound by
  // the add latency (a few GB/s), not by memory.
  constexpr size_t kLanes = 32;
  double best = 1e30;
  volatile float sink = 0;
  for (int rep = 0; rep < 5; ++rep) {
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
    measured.sgemm_gflops = MeasureSgemm();
    measured.read_gb_per_s = MeasureReadBandwidth();
    std::fprintf(stderr, "machine limits: sgemm %.1f GFLOP/s, memory read %.1f GB/s (%d threads)\n",
                 measured.sgemm_gflops, measured.read_gb_per_s, omp_get_max_threads());
    return measured;
  }();
  return limits;
}

}  // namespace switchserve::bench
