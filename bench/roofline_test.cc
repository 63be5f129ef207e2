// The limits engine_bench compares itself with (bench/roofline.h).
#include "bench/roofline.h"

#include <cblas.h>
#include <gtest/gtest.h>

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

TEST(MachineLimits, FirstMeasurementIsKeptForTheProcess) {
  const MachineLimits& first = MeasureMachineLimits();
  const MachineLimits& again = MeasureMachineLimits();
  EXPECT_EQ(&first, &again);
  EXPECT_GT(first.sgemm_gflops, 0);
  EXPECT_GT(first.read_gb_per_s, 0);
}

}  // namespace
}  // namespace switchserve::bench
