#include "server/metrics/output_buffer_metrics.h"

#include "prometheus/client_metric.h"
#include "prometheus/metric_type.h"

namespace switchserve {
namespace {

prometheus::MetricFamily Gauge(const char* name, const char* help, double value) {
  prometheus::MetricFamily family;
  family.name = name;
  family.help = help;
  family.type = prometheus::MetricType::Gauge;
  prometheus::ClientMetric metric;
  metric.gauge.value = value;
  family.metric.push_back(metric);
  return family;
}

}  // namespace

std::vector<prometheus::MetricFamily> OutputBufferMetrics::Collect() const {
  return {Gauge("switchserve_output_buffer_bytes",
                "Bytes of output waiting for clients now (streams' unread output, non-streamed "
                "HTTP responses being written), of --output-buffer-bytes.",
                static_cast<double>(used_bytes_())),
          Gauge("switchserve_output_buffer_limit_bytes",
                "The output all clients together may leave waiting (--output-buffer-bytes).",
                static_cast<double>(limit_bytes_))};
}

}  // namespace switchserve
