// This machine's limits, measured in the same process as the benchmark that
// is compared with them: the f32 GEMM rate (OpenBLAS sgemm on all threads)
// and the memory read bandwidth (a streaming OpenMP reduction over a buffer
// much larger than the caches, on huge pages as the weights are); beside
// them, the round trip of a cache line between cores, which tells how the
// cores are placed.
#ifndef SWITCHSERVE_BENCH_ROOFLINE_H_
#define SWITCHSERVE_BENCH_ROOFLINE_H_

#include <string>

namespace switchserve::bench {

struct MachineLimits {
  double sgemm_gflops = 0;   // best of a few 2048^3 sgemm calls
  double read_gb_per_s = 0;  // best of a few passes over 1 GiB
  // How long one cache line takes to go to another core and back (two
  // threads handing it to each other; the slowest pair of the first CPU the
  // process may run on and each other one; 0 with one CPU). Where two cores
  // sit behind separate memory links (AMD's core complexes, separate
  // sockets) this is several times what it is between cores that share a
  // last-level cache, and the read bandwidth of all cores together is the
  // sum of the links': a VM whose vCPUs the host moves between those
  // placements changes both together.
  double core_round_trip_ns = 0;
};

// The OpenBLAS kernels the sgemm limit runs on, as OpenBLAS names them
// ("Cooperlake", "Haswell"), marked "(OPENBLAS_CORETYPE=...)" where that
// environment variable chose them instead of OpenBLAS's own detection, and
// with the core the detection picked where UseThisCpusOpenBlasKernels set
// the variable. A forced older core understates the limit: Haswell's AVX2
// kernels reach about half the sgemm rate of the AVX-512 ones on a CPU with
// full-width AVX-512 (measured on an AMD EPYC Zen 5 VM, docs/performance.md).
std::string SgemmKernels();
// The same from OpenBLAS's core name, the variable's value and the core
// OpenBLAS's detection picked before UseThisCpusOpenBlasKernels set it
// (null: unset).
std::string DescribeSgemmKernels(const char* core_name, const char* forced_core,
                                 const char* detected_core = nullptr);

// The vector instructions that decide which of OpenBLAS's x86 kernels a CPU
// runs best.
struct CpuVectorFeatures {
  bool avx = false;
  bool avx2_fma = false;
  bool avx512 = false;  // F, BW, DQ, VL and CD, as OpenBLAS's SkylakeX kernels need
  bool avx512_bf16 = false;
  bool amx = false;
};
CpuVectorFeatures ThisCpusVectorFeatures();

// The OpenBLAS core (its OPENBLAS_CORETYPE name) whose kernels use the
// widest instructions `cpu` runs where `detected`, the core OpenBLAS's own
// detection picked, uses narrower ones; null where `detected` is as wide.
// OpenBLAS detects x86 CPUs by family and model, so a CPU newer than the
// installed library gets a fallback: Debian 12's OpenBLAS 0.3.21 runs its
// Prescott (SSE3) kernels on Intel's Emerald Rapids (family 6, model 207),
// at a third of the sgemm rate of its SkylakeX ones there.
const char* OpenBlasCoreToForce(const char* detected, const CpuVectorFeatures& cpu);
// The same for the core OpenBLAS runs in this process, on this CPU.
const char* OpenBlasCoreToForceHere();

// Where OPENBLAS_CORETYPE is unset and OpenBLAS's detection picked kernels
// narrower than this CPU runs (OpenBlasCoreToForce), starts the process
// again with the variable naming this CPU's core (OpenBLAS reads it when it
// loads), so that the sgemm limit is this machine's. Says so on stderr.
// Returns where nothing needs to change or the new start failed.
void UseThisCpusOpenBlasKernels(char** argv);

// Measures once per process and caches the result; prints the limits, and
// on stderr a warning where OPENBLAS_CORETYPE chose sgemm kernels narrower
// than this CPU's (OpenBlasCoreToForceHere).
const MachineLimits& MeasureMachineLimits();

// Measures again, now, with the buffers of the first measurement and fewer
// passes (about half a second). A shared VM's bandwidth and compute drift by
// up to 1.5x within minutes; a benchmark measured between two of these
// compares itself with limits of the same minutes.
MachineLimits MeasureMachineLimitsNow();

// MachineLimits::core_round_trip_ns alone, now, among the CPUs the calling
// thread may run on (best of three runs of each pair; a few milliseconds).
double MeasureCoreRoundTripNs();

}  // namespace switchserve::bench

#endif  // SWITCHSERVE_BENCH_ROOFLINE_H_
