// The output waiting for clients (--output-buffer-bytes): what is held of
// that budget now, and its limit, as two gauges read at scrape time
// (switchserve_output_buffer_bytes, switchserve_output_buffer_limit_bytes;
// docs/metrics.md). Nothing is counted on the serving paths: the value is
// the budget's own count, read when Prometheus scrapes.
//
// Thread-safe: `used_bytes` must be (ByteBudget::used is).
#ifndef SWITCHSERVE_SERVER_METRICS_OUTPUT_BUFFER_METRICS_H_
#define SWITCHSERVE_SERVER_METRICS_OUTPUT_BUFFER_METRICS_H_

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace switchserve {

class OutputBufferMetrics : public prometheus::Collectable {
 public:
  OutputBufferMetrics(std::function<int64_t()> used_bytes, int64_t limit_bytes)
      : used_bytes_(std::move(used_bytes)), limit_bytes_(limit_bytes) {}
  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  const std::function<int64_t()> used_bytes_;
  const int64_t limit_bytes_;
};

}  // namespace switchserve

#endif  // SWITCHSERVE_SERVER_METRICS_OUTPUT_BUFFER_METRICS_H_
