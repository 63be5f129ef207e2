#include "bench/roofline.h"

#include <cblas.h>
#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string_view>
#include <system_error>
#include <thread>
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

void PinTo(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

// Mean time of `trips` round trips of one cache line between a thread on
// `cpu_a` and one on `cpu_b`: each waits for the other's number, then writes
// its own.
double RoundTripNs(int cpu_a, int cpu_b, int trips) {
  alignas(64) std::atomic<int> turn{0};
  std::chrono::steady_clock::time_point start;
  std::thread b([&] {
    PinTo(cpu_b);
    for (int i = 0; i < trips; ++i) {
      while (turn.load(std::memory_order_acquire) != 2 * i + 1) {
      }
      turn.store(2 * i + 2, std::memory_order_release);
    }
  });
  std::thread a([&] {
    PinTo(cpu_a);
    start = std::chrono::steady_clock::now();
    for (int i = 0; i < trips; ++i) {
      turn.store(2 * i + 1, std::memory_order_release);
      while (turn.load(std::memory_order_acquire) != 2 * i + 2) {
      }
    }
  });
  a.join();
  const double seconds = Seconds(start);
  b.join();
  return seconds * 1e9 / trips;
}

}  // namespace

// The environment variable UseThisCpusOpenBlasKernels leaves for the new
// start: the core OpenBLAS's detection had picked.
constexpr char kDetectedCoreVariable[] = "SWITCHSERVE_OPENBLAS_DETECTED_CORE";

std::string DescribeSgemmKernels(const char* core_name, const char* forced_core,
                                 const char* detected_core) {
  std::string kernels = core_name != nullptr ? core_name : "unknown";
  if (forced_core != nullptr) {
    kernels += std::string(" (OPENBLAS_CORETYPE=") + forced_core;
    if (detected_core != nullptr) {
      kernels += std::string(", set for this CPU: OpenBLAS detected ") + detected_core;
    }
    kernels += ")";
  }
  return kernels;
}

std::string SgemmKernels() {
  return DescribeSgemmKernels(openblas_get_corename(), std::getenv("OPENBLAS_CORETYPE"),
                              std::getenv(kDetectedCoreVariable));
}

CpuVectorFeatures ThisCpusVectorFeatures() {
  CpuVectorFeatures cpu;
  cpu.avx = __builtin_cpu_supports("avx");
  cpu.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  cpu.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
               __builtin_cpu_supports("avx512cd");
  cpu.avx512_bf16 = cpu.avx512 && __builtin_cpu_supports("avx512bf16");
  cpu.amx = cpu.avx512_bf16 && __builtin_cpu_supports("amx-tile");
  return cpu;
}

namespace {

// OpenBLAS's x86 cores by the widest instructions their kernels use: 0 SSE,
// 1 AVX, 2 AVX2 and FMA, 3 AVX-512, 4 AVX-512 BF16, 5 AMX.
int CoreLevel(std::string_view core) {
  if (core == "SapphireRapids") return 5;
  if (core == "Cooperlake") return 4;
  if (core == "SkylakeX") return 3;
  if (core == "Haswell" || core == "Zen" || core == "Excavator") return 2;
  if (core == "Sandybridge" || core == "Bulldozer" || core == "Piledriver" ||
      core == "Steamroller") {
    return 1;
  }
  return 0;
}

}  // namespace

const char* OpenBlasCoreToForce(const char* detected, const CpuVectorFeatures& cpu) {
  const char* widest = cpu.amx           ? "SapphireRapids"
                       : cpu.avx512_bf16 ? "Cooperlake"
                       : cpu.avx512      ? "SkylakeX"
                       : cpu.avx2_fma    ? "Haswell"
                       : cpu.avx         ? "Sandybridge"
                                         : nullptr;
  if (widest == nullptr) return nullptr;
  return CoreLevel(detected != nullptr ? detected : "") < CoreLevel(widest) ? widest : nullptr;
}

const char* OpenBlasCoreToForceHere() {
  return OpenBlasCoreToForce(openblas_get_corename(), ThisCpusVectorFeatures());
}

void UseThisCpusOpenBlasKernels(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return;
  const char* core = OpenBlasCoreToForceHere();
  if (core == nullptr) return;
  const char* detected = openblas_get_corename() != nullptr ? openblas_get_corename() : "unknown";
  std::fprintf(stderr,
               "OpenBLAS detected its %s kernels for this CPU, which runs %s's: starting again "
               "with OPENBLAS_CORETYPE=%s\n",
               detected, core, core);
  // The program's own path, so that the process keeps its name.
  std::error_code error;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
  if (error || setenv("OPENBLAS_CORETYPE", core, /*overwrite=*/1) != 0 ||
      setenv(kDetectedCoreVariable, detected, 1) != 0) {
    return;
  }
  execv(self.c_str(), argv);  // returns only if it failed: go on as we are
  unsetenv("OPENBLAS_CORETYPE");
  unsetenv(kDetectedCoreVariable);
}

double MeasureCoreRoundTripNs() {
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return 0;
  std::vector<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &allowed)) cpus.push_back(cpu);
  }
  double slowest = 0;
  for (size_t i = 1; i < cpus.size(); ++i) {
    double best = 1e30;
    for (int rep = 0; rep < 3; ++rep) best = std::min(best, RoundTripNs(cpus[0], cpus[i], 4000));
    slowest = std::max(slowest, best);
  }
  return slowest;
}

const MachineLimits& MeasureMachineLimits() {
  static const MachineLimits limits = [] {
    MachineLimits measured;
    measured.sgemm_gflops = MeasureSgemm(4);
    measured.read_gb_per_s = MeasureReadBandwidth(5);
    measured.core_round_trip_ns = MeasureCoreRoundTripNs();
    const char* forced = std::getenv("OPENBLAS_CORETYPE");
    const std::string kernels = SgemmKernels();
    std::fprintf(stderr,
                 "machine limits: sgemm %.1f GFLOP/s (OpenBLAS %s kernels), memory read %.1f "
                 "GB/s (%d threads); core-to-core round trip %.0f ns\n",
                 measured.sgemm_gflops, kernels.c_str(), measured.read_gb_per_s,
                 omp_get_max_threads(), measured.core_round_trip_ns);
    const char* wider = OpenBlasCoreToForceHere();
    if (forced != nullptr && wider != nullptr) {
      std::fprintf(stderr,
                   "warning: OPENBLAS_CORETYPE=%s chose OpenBLAS's %s kernels, narrower than "
                   "this CPU's (%s): the sgemm limit is understated (run with `env -u "
                   "OPENBLAS_CORETYPE` to measure this CPU's)\n",
                   forced, openblas_get_corename(), wider);
    }
    return measured;
  }();
  return limits;
}

MachineLimits MeasureMachineLimitsNow() {
  MachineLimits measured;
  measured.sgemm_gflops = MeasureSgemm(2);
  measured.read_gb_per_s = MeasureReadBandwidth(3);
  measured.core_round_trip_ns = MeasureCoreRoundTripNs();
  return measured;
}

}  // namespace switchserve::bench
