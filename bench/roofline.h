// This machine's limits, measured in the same process as the benchmark that
// is compared with them: the f32 GEMM rate (OpenBLAS sgemm on all threads)
// and the memory read bandwidth (a streaming OpenMP reduction over a buffer
// much larger than the caches, on huge pages as the weights are).
#ifndef SWITCHSERVE_BENCH_ROOFLINE_H_
#define SWITCHSERVE_BENCH_ROOFLINE_H_

namespace switchserve::bench {

struct MachineLimits {
  double sgemm_gflops = 0;   // best of a few 2048^3 sgemm calls
  double read_gb_per_s = 0;  // best of a few passes over 1 GiB
};

// Measures once per process and caches the result.
const MachineLimits& MeasureMachineLimits();

// Measures again, now, with the buffers of the first measurement and fewer
// passes (about half a second). A shared VM's bandwidth and compute drift by
// up to 1.5x within minutes; a benchmark measured between two of these
// compares itself with limits of the same minutes.
MachineLimits MeasureMachineLimitsNow();

}  // namespace switchserve::bench

#endif  // SWITCHSERVE_BENCH_ROOFLINE_H_
