// Per-request measurements of the load generator and their summary
// (throughput, TTFT / TPOT / latency percentiles).
#ifndef SWITCHSERVE_BENCH_LOAD_LATENCY_STATS_H_
#define SWITCHSERVE_BENCH_LOAD_LATENCY_STATS_H_

#include <map>
#include <mutex>
#include <string>
#include <vector>

namespace switchserve::bench {

struct RequestSample {
  bool ok = false;
  std::string error;      // status code name when !ok
  int tokens = 0;         // generated tokens received
  double ttft_ms = 0;     // first token received - request sent
  double latency_ms = 0;  // stream finished - request sent
  double tpot_ms = 0;     // (latency - ttft) / (tokens - 1); 0 with one token
};

// Thread-safe collection of samples.
class LatencyStats {
 public:
  void Add(const RequestSample& sample);
  // A human-readable report for a run that lasted `wall_s` seconds, in which
  // this process used `cpu_s` seconds of CPU (user + system, all threads).
  std::string Report(double wall_s, double cpu_s) const;

 private:
  mutable std::mutex mu_;
  std::vector<RequestSample> samples_;
};

// The q-quantile (0..1) of `values` by nearest rank; 0 for an empty list.
double Percentile(std::vector<double> values, double q);

}  // namespace switchserve::bench

#endif  // SWITCHSERVE_BENCH_LOAD_LATENCY_STATS_H_
