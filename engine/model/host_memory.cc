#include "engine/model/host_memory.h"

#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <limits>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "engine/model/cgroups.h"

namespace switchserve {
namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

// A cgroup memory limit file: a byte count, or "max" (none).
int64_t CgroupLimit(const std::string& path) {
  int64_t bytes = 0;
  if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(ReadSmallFile(path)), &bytes) || bytes <= 0) {
    return kMax;
  }
  return bytes;
}

int64_t ReadHostMemory() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  const int64_t bytes = pages > 0 && page_size > 0 ? SaturatingMul(pages, page_size) : kMax;
  return std::min(bytes, CgroupMemoryLimit(ReadSmallFile("/proc/self/cgroup"), "/sys/fs/cgroup"));
}

}  // namespace

int64_t CgroupMemoryLimit(std::string_view proc_self_cgroup, const std::string& root) {
  const CgroupDirectories directories = CgroupDirectoriesOf(proc_self_cgroup, root, "memory");
  int64_t bytes = kMax;
  for (const std::string& directory : directories.v2) {
    bytes = std::min(bytes, CgroupLimit(directory + "/memory.max"));
  }
  for (const std::string& directory : directories.v1) {
    bytes = std::min(bytes, CgroupLimit(directory + "/memory.limit_in_bytes"));
  }
  return bytes;
}

int64_t HostMemoryBytes() {
  static const int64_t bytes = ReadHostMemory();
  return bytes;
}

int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size_pages = 0, resident_pages = 0;
  if (!(statm >> size_pages >> resident_pages)) return 0;
  return SaturatingMul(resident_pages, sysconf(_SC_PAGESIZE));
}

int64_t SaturatingMul(int64_t a, int64_t b) {
  int64_t product = 0;
  if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &product)) return kMax;
  return product;
}

int64_t SaturatingAdd(int64_t a, int64_t b) {
  int64_t sum = 0;
  if (a < 0 || b < 0 || __builtin_add_overflow(a, b, &sum)) return kMax;
  return sum;
}

absl::Status CheckFitsInHostMemory(int64_t bytes, const std::string& what) {
  const int64_t limit = HostMemoryBytes();
  if (bytes <= limit) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(
      what, " needs ", bytes == kMax ? std::string("more than 2^63") : absl::StrCat(bytes),
      " bytes, more than this host's memory (", limit, " bytes)"));
}

}  // namespace switchserve
