// The standard process_* metrics every Prometheus client library exports
// (CPU seconds, resident and virtual memory, open and max file descriptors,
// start time, threads), read from /proc/self at scrape time. Linux only; on
// a read error the affected series is left out of that scrape.
//
// Thread-safe: Collect reads only the process's own /proc entries.
#ifndef SWITCHSERVE_SERVER_METRICS_PROCESS_METRICS_H_
#define SWITCHSERVE_SERVER_METRICS_PROCESS_METRICS_H_

#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace switchserve {

class ProcessMetrics : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override;
};

}  // namespace switchserve

#endif  // SWITCHSERVE_SERVER_METRICS_PROCESS_METRICS_H_
