#include "server/metrics/process_metrics.h"

#include <sys/resource.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "prometheus/client_metric.h"
#include "prometheus/metric_type.h"

namespace switchserve {
namespace {

prometheus::MetricFamily OneValue(const char* name, const char* help, prometheus::MetricType type,
                                  double value) {
  prometheus::MetricFamily family;
  family.name = name;
  family.help = help;
  family.type = type;
  prometheus::ClientMetric metric;
  if (type == prometheus::MetricType::Counter) {
    metric.counter.value = value;
  } else {
    metric.gauge.value = value;
  }
  family.metric.push_back(metric);
  return family;
}

// Fields of /proc/self/stat after the command name (field 3 onward), which may
// itself contain spaces and parentheses.
bool ReadStatFields(std::vector<std::string>* fields) {
  std::ifstream in("/proc/self/stat");
  std::string line;
  if (!std::getline(in, line)) return false;
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return false;
  std::istringstream rest(line.substr(close + 1));
  std::string field;
  while (rest >> field) fields->push_back(field);
  return fields->size() >= 22;
}

double Number(const std::string& text) { return std::strtod(text.c_str(), nullptr); }

double BootTimeSeconds() {
  std::ifstream in("/proc/stat");
  std::string key;
  double value = 0;
  while (in >> key) {
    if (key == "btime") {
      in >> value;
      return value;
    }
    in.ignore(1 << 16, '\n');
  }
  return 0;
}

}  // namespace

std::vector<prometheus::MetricFamily> ProcessMetrics::Collect() const {
  using prometheus::MetricType;
  std::vector<prometheus::MetricFamily> out;
  std::vector<std::string> stat;
  if (ReadStatFields(&stat)) {
    // stat[k] is field k + 3 of proc(5): utime 14, stime 15, num_threads 20,
    // starttime 22, vsize 23, rss 24.
    const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
    const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
    const double cpu = (Number(stat[11]) + Number(stat[12])) / ticks;
    out.push_back(OneValue("process_cpu_seconds_total", "User and system CPU time in seconds.",
                           MetricType::Counter, cpu));
    out.push_back(OneValue("process_threads", "Threads in the process.", MetricType::Gauge,
                           Number(stat[17])));
    out.push_back(OneValue("process_start_time_seconds",
                           "Start time of the process since the Unix epoch in seconds.",
                           MetricType::Gauge, BootTimeSeconds() + Number(stat[19]) / ticks));
    out.push_back(OneValue("process_virtual_memory_bytes", "Virtual memory size in bytes.",
                           MetricType::Gauge, Number(stat[20])));
    out.push_back(OneValue("process_resident_memory_bytes", "Resident memory size in bytes.",
                           MetricType::Gauge, Number(stat[21]) * page));
  }
  std::error_code error;
  double open_fds = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/self/fd", error);
       !error && it != std::filesystem::directory_iterator(); it.increment(error)) {
    ++open_fds;
  }
  if (!error) {
    out.push_back(
        OneValue("process_open_fds", "Open file descriptors.", MetricType::Gauge, open_fds));
  }
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0) {
    out.push_back(OneValue("process_max_fds", "Maximum number of open file descriptors.",
                           MetricType::Gauge, static_cast<double>(limit.rlim_cur)));
  }
  return out;
}

}  // namespace switchserve
