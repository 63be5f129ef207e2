// The CPUs this process may keep busy, for the CPU backend's default thread
// count: those of its affinity mask (taskset, a cpuset), fewer when a cgroup
// CPU quota allows fewer (a container's `cpu` limit, which is a quota, not
// a set of CPUs: threads beyond it are throttled, not run).
#ifndef SWITCHSERVE_ENGINE_MODEL_HOST_CPUS_H_
#define SWITCHSERVE_ENGINE_MODEL_HOST_CPUS_H_

#include <string>
#include <string_view>

namespace switchserve {

struct HostCpus {
  int count = 1;               // at least 1
  bool quota_limited = false;  // the cgroup quota, not the affinity mask, set it
};

// Read once.
HostCpus AvailableCpus();

// The fewest cores the CPU quotas of the process's cgroup and its ancestors
// allow (cgroup v2 cpu.max, v1 cpu.cfs_quota_us / cpu.cfs_period_us), under
// the cgroup mount `root`, as /proc/self/cgroup's text names them
// (cgroups.h); 0 for no quota.
int CgroupCpuCores(std::string_view proc_self_cgroup, const std::string& root);

// The cores a cgroup v2 `cpu.max` ("200000 100000"; "max 100000": none)
// allows, rounded up; 0 for no quota or text that is none.
int CoresOfCpuMax(std::string_view text);
// The same for cgroup v1's cpu.cfs_quota_us (-1: none) and cpu.cfs_period_us.
int CoresOfCfsQuota(std::string_view quota_us, std::string_view period_us);

}  // namespace switchserve

#endif  // SWITCHSERVE_ENGINE_MODEL_HOST_CPUS_H_
