#include "engine/model/host_cpus.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/numbers.h"

namespace switchserve {
namespace {

std::string ReadFile(const char* path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

int CoresOf(int64_t quota, int64_t period) {
  if (quota <= 0 || period <= 0) return 0;
  return static_cast<int>(std::min<int64_t>((quota + period - 1) / period, 1 << 20));
}

HostCpus ReadAvailableCpus() {
  HostCpus cpus;
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof(mask), &mask) == 0) {
    cpus.count = CPU_COUNT(&mask);
  } else {
    cpus.count = static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
  }
  cpus.count = std::max(cpus.count, 1);
  int quota = CoresOfCpuMax(ReadFile("/sys/fs/cgroup/cpu.max"));  // v2
  if (quota == 0) {
    quota = CoresOfCfsQuota(ReadFile("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"),  // v1
                            ReadFile("/sys/fs/cgroup/cpu/cpu.cfs_period_us"));
  }
  if (quota > 0 && quota < cpus.count) {
    cpus.count = quota;
    cpus.quota_limited = true;
  }
  return cpus;
}

}  // namespace

HostCpus AvailableCpus() {
  static const HostCpus cpus = ReadAvailableCpus();
  return cpus;
}

int CoresOfCpuMax(std::string_view text) {
  std::istringstream in{std::string(text)};
  std::string quota, period, rest;
  if (!(in >> quota >> period) || in >> rest) return 0;
  return CoresOfCfsQuota(quota, period);
}

int CoresOfCfsQuota(std::string_view quota_us, std::string_view period_us) {
  int64_t quota = 0, period = 0;
  if (!absl::SimpleAtoi(absl::string_view(quota_us.data(), quota_us.size()), &quota) ||
      !absl::SimpleAtoi(absl::string_view(period_us.data(), period_us.size()), &period)) {
    return 0;
  }
  return CoresOf(quota, period);
}

}  // namespace switchserve
