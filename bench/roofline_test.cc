// The limits engine_bench compares itself with (bench/roofline.h).
#include "bench/roofline.h"

#include <cblas.h>
#include <gtest/gtest.h>
#include <pthread.h>
#include <sched.h>

#include <cstdlib>
#include <string>
#include <thread>

namespace switchserve::bench {
namespace {

// The CPU backend sets OpenBLAS to one thread. Measuring again next to a
// benchmark runs sgemm on all threads, and must then give the backend its
// one thread back.
TEST(MachineLimits, MeasuringAgainKeepsTheCallersOpenBlasThreads) {
  const int original = openblas_get_num_threads();
  openblas_set_num_threads(1);
  const MachineLimits now = MeasureMachineLimitsNow();
  EXPECT_EQ(openblas_get_num_threads(), 1);
  EXPECT_GT(now.sgemm_gflops, 0);
  EXPECT_GT(now.read_gb_per_s, 0);
  openblas_set_num_threads(original);
}

// The limit names the kernels it ran on, and says when an environment
// variable, not OpenBLAS's detection of this CPU, chose them.
TEST(MachineLimits, SgemmKernelsSayWhenOpenBlasCoretypeChoseThem) {
  EXPECT_EQ(DescribeSgemmKernels("Cooperlake", nullptr), "Cooperlake");
  EXPECT_EQ(DescribeSgemmKernels("Haswell", "Haswell"), "Haswell (OPENBLAS_CORETYPE=Haswell)");
  EXPECT_EQ(DescribeSgemmKernels(nullptr, nullptr), "unknown");
  const std::string here = SgemmKernels();
  EXPECT_EQ(here.find("OPENBLAS_CORETYPE") != std::string::npos,
            std::getenv("OPENBLAS_CORETYPE") != nullptr)
      << here;
}

// Where UseThisCpusOpenBlasKernels chose the core, the description says
// what OpenBLAS's own detection had picked.
TEST(MachineLimits, SgemmKernelsNameTheDetectedCoreWhereTheBenchmarkChoseAnother) {
  EXPECT_EQ(DescribeSgemmKernels("SkylakeX", "SkylakeX", "Prescott"),
            "SkylakeX (OPENBLAS_CORETYPE=SkylakeX, set for this CPU: OpenBLAS detected Prescott)");
}

// A detected core narrower than the CPU's widest instructions gives way to
// the core of those; a core as wide or wider, or a CPU without AVX, keeps
// OpenBLAS's choice.
TEST(MachineLimits, OpenBlasFallbackCoresGiveWayToTheCpusWidest) {
  CpuVectorFeatures sse;
  CpuVectorFeatures avx2 = sse;
  avx2.avx = avx2.avx2_fma = true;
  CpuVectorFeatures avx512 = avx2;
  avx512.avx512 = true;
  CpuVectorFeatures bf16 = avx512;
  bf16.avx512_bf16 = true;
  CpuVectorFeatures amx = bf16;
  amx.amx = true;

  // Debian 12's OpenBLAS on Intel's Emerald Rapids.
  EXPECT_STREQ(OpenBlasCoreToForce("Prescott", avx512), "SkylakeX");
  EXPECT_STREQ(OpenBlasCoreToForce("Prescott", bf16), "Cooperlake");
  EXPECT_STREQ(OpenBlasCoreToForce("Prescott", amx), "SapphireRapids");
  EXPECT_STREQ(OpenBlasCoreToForce("Nehalem", avx2), "Haswell");
  EXPECT_STREQ(OpenBlasCoreToForce("Haswell", avx512), "SkylakeX");
  EXPECT_STREQ(OpenBlasCoreToForce(nullptr, avx2), "Haswell");

  EXPECT_EQ(OpenBlasCoreToForce("SkylakeX", avx512), nullptr);
  EXPECT_EQ(OpenBlasCoreToForce("Cooperlake", avx512), nullptr);
  EXPECT_EQ(OpenBlasCoreToForce("Zen", avx2), nullptr);
  EXPECT_EQ(OpenBlasCoreToForce("Haswell", avx2), nullptr);
  EXPECT_EQ(OpenBlasCoreToForce("SapphireRapids", amx), nullptr);
  EXPECT_EQ(OpenBlasCoreToForce("Prescott", sse), nullptr);
}

TEST(MachineLimits, FirstMeasurementIsKeptForTheProcess) {
  const MachineLimits& first = MeasureMachineLimits();
  const MachineLimits& again = MeasureMachineLimits();
  EXPECT_EQ(&first, &again);
  EXPECT_GT(first.sgemm_gflops, 0);
  EXPECT_GT(first.read_gb_per_s, 0);
}

// Two CPUs: a positive time well under a millisecond (a cache line goes
// and comes back in tens to hundreds of nanoseconds). A thread that may run
// on one CPU only has no pair to measure: 0.
TEST(MachineLimits, CoreRoundTripNeedsTwoCpus) {
  cpu_set_t allowed;
  ASSERT_EQ(sched_getaffinity(0, sizeof(allowed), &allowed), 0);
  int first = -1;
  for (int cpu = 0; cpu < CPU_SETSIZE && first < 0; ++cpu) {
    if (CPU_ISSET(cpu, &allowed)) first = cpu;
  }
  if (CPU_COUNT(&allowed) >= 2) {
    const double ns = MeasureCoreRoundTripNs();
    EXPECT_GT(ns, 0);
    EXPECT_LT(ns, 1e6);
  }
  double on_one = -1;
  std::thread pinned([&] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    pthread_setaffinity_np(pthread_self(), sizeof(one), &one);
    on_one = MeasureCoreRoundTripNs();
  });
  pinned.join();
  EXPECT_EQ(on_one, 0);
}

}  // namespace
}  // namespace switchserve::bench
