#include "bench/load/latency_stats.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"

namespace switchserve::bench {

double Percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t rank = static_cast<size_t>(std::ceil(q * static_cast<double>(values.size())));
  return values[std::min(values.size() - 1, rank == 0 ? 0 : rank - 1)];
}

void LatencyStats::Add(const RequestSample& sample) {
  std::lock_guard<std::mutex> lock(mu_);
  samples_.push_back(sample);
}

std::string LatencyStats::Report(double wall_s, double cpu_s) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<double> ttft, tpot, latency;
  std::map<std::string, int> errors;
  long tokens = 0;
  int ok = 0;
  for (const RequestSample& s : samples_) {
    if (!s.ok) {
      ++errors[s.error];
      continue;
    }
    ++ok;
    tokens += s.tokens;
    ttft.push_back(s.ttft_ms);
    latency.push_back(s.latency_ms);
    if (s.tokens > 1) tpot.push_back(s.tpot_ms);
  }
  std::string out = absl::StrFormat(
      "requests: %d ok, %d failed in %.2f s\nthroughput: %.2f requests/s, %.1f tokens/s\n", ok,
      static_cast<int>(samples_.size()) - ok, wall_s, ok / wall_s, tokens / wall_s);
  auto line = [&](const char* name, const std::vector<double>& v) {
    out += absl::StrFormat("%-12s p50 %9.2f ms   p90 %9.2f ms   p99 %9.2f ms\n", name,
                           Percentile(v, 0.5), Percentile(v, 0.9), Percentile(v, 0.99));
  };
  line("TTFT", ttft);
  line("TPOT", tpot);
  line("latency", latency);
  // In-process, this is the engine's CPU; over gRPC or HTTP, the client's.
  out += absl::StrFormat(
      "cpu: %.3f s user+system in this process during the load, %.2f us per token\n", cpu_s,
      tokens > 0 ? cpu_s * 1e6 / static_cast<double>(tokens) : 0.0);
  for (const auto& [code, count] : errors) out += absl::StrFormat("error %s: %d\n", code, count);
  return out;
}

}  // namespace switchserve::bench
