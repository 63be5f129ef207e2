// The memory ceiling of this host, and overflow-safe size arithmetic. Every
// allocation a config.json or a flag asks for is checked against it before it
// is made, so that an absurd size is refused with a message instead of ending
// in std::bad_alloc or the kernel's OOM killer.
#ifndef SWITCHSERVE_ENGINE_MODEL_HOST_MEMORY_H_
#define SWITCHSERVE_ENGINE_MODEL_HOST_MEMORY_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace switchserve {

// Physical memory, or the process's cgroup memory limit when that is lower.
// Read once.
int64_t HostMemoryBytes();

// The smallest memory limit (cgroup v2 memory.max, v1
// memory.limit_in_bytes) of the process's cgroup and its ancestors, under
// the cgroup mount `root`, as /proc/self/cgroup's text names them
// (cgroups.h); INT64_MAX for none.
int64_t CgroupMemoryLimit(std::string_view proc_self_cgroup, const std::string& root);

// This process's resident memory now (/proc/self/statm); 0 when unknown.
int64_t ResidentBytes();

// a * b and a + b for sizes (a, b >= 0), saturating at INT64_MAX.
int64_t SaturatingMul(int64_t a, int64_t b);
int64_t SaturatingAdd(int64_t a, int64_t b);

// RESOURCE_EXHAUSTED naming `what` when `bytes` exceed HostMemoryBytes().
absl::Status CheckFitsInHostMemory(int64_t bytes, const std::string& what);

}  // namespace switchserve

#endif  // SWITCHSERVE_ENGINE_MODEL_HOST_MEMORY_H_
