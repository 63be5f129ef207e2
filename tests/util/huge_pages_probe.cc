#include "tests/util/huge_pages_probe.h"

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>

namespace switchserve::testing {
namespace {

// The bytes of the first "AnonHugePages: N kB" line of `in` that follows a
// mapping header whose range [begin, end) `inside` accepts.
template <typename Inside>
int64_t AnonHugePages(std::ifstream& in, Inside inside) {
  std::string line;
  bool counting = false;
  while (std::getline(in, line)) {
    unsigned long begin = 0, end = 0;
    // A mapping's first line: "begin-end perms offset dev inode [path]".
    if (std::sscanf(line.c_str(), "%lx-%lx ", &begin, &end) == 2) {
      counting = inside(begin, end);
      continue;
    }
    unsigned long kib = 0;
    if (counting && std::sscanf(line.c_str(), "AnonHugePages: %lu kB", &kib) == 1) {
      return static_cast<int64_t>(kib) * 1024;
    }
  }
  return 0;
}

}  // namespace

std::string ThpMode() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string line;
  if (!std::getline(in, line)) return "never";
  const size_t open = line.find('['), close = line.find(']');
  return open == std::string::npos ? "never" : line.substr(open + 1, close - open - 1);
}

int64_t HugePageBytesOfMapping(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  std::ifstream smaps("/proc/self/smaps");
  return AnonHugePages(smaps, [address](unsigned long begin, unsigned long end) {
    return address >= begin && address < end;
  });
}

int64_t ProcessHugePageBytes() {
  // smaps_rollup has one header line, for the whole process.
  std::ifstream rollup("/proc/self/smaps_rollup");
  return AnonHugePages(rollup, [](unsigned long, unsigned long) { return true; });
}

}  // namespace switchserve::testing
