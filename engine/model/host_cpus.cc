#include "engine/model/host_cpus.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <string>

#include "absl/strings/numbers.h"
#include "engine/model/cgroups.h"

namespace switchserve {
namespace {

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
  const int quota = CgroupCpuCores(ReadSmallFile("/proc/self/cgroup"), "/sys/fs/cgroup");
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

int CgroupCpuCores(std::string_view proc_self_cgroup, const std::string& root) {
  const CgroupDirectories directories = CgroupDirectoriesOf(proc_self_cgroup, root, "cpu");
  int cores = 0;
  auto take = [&cores](int quota) {
    if (quota > 0 && (cores == 0 || quota < cores)) cores = quota;
  };
  for (const std::string& directory : directories.v2) {
    take(CoresOfCpuMax(ReadSmallFile(directory + "/cpu.max")));
  }
  for (const std::string& directory : directories.v1) {
    take(CoresOfCfsQuota(ReadSmallFile(directory + "/cpu.cfs_quota_us"),
                         ReadSmallFile(directory + "/cpu.cfs_period_us")));
  }
  return cores;
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
