#include "engine/model/weight_storage.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <new>
#include <string>

namespace switchserve {
namespace {

size_t RoundedToHugePages(size_t bytes) {
  return (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
}

}  // namespace

void* AllocateHugePageBytes(size_t bytes) {
  const size_t rounded = RoundedToHugePages(bytes);
  // Mapped with a huge page's worth of slack, then trimmed to a 2 MiB
  // boundary at both ends.
  const size_t mapped = rounded + kHugePageBytes;
  void* map = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (map == MAP_FAILED) throw std::bad_alloc();
  const auto start = reinterpret_cast<uintptr_t>(map);
  const uintptr_t aligned = (start + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  if (aligned > start) munmap(map, aligned - start);
  const uintptr_t tail = aligned + rounded;
  if (tail < start + mapped) munmap(reinterpret_cast<void*>(tail), start + mapped - tail);
  void* p = reinterpret_cast<void*>(aligned);
  // Before the first touch, so that the page faults allocate huge pages. An
  // error (a kernel without THP) leaves ordinary pages: nothing to do.
  (void)madvise(p, rounded, MADV_HUGEPAGE);
  return p;
}

void FreeHugePageBytes(void* p, size_t bytes) { munmap(p, RoundedToHugePages(bytes)); }

int64_t HugePageBytesOfMapping(const void* p) {
  const auto address = reinterpret_cast<uintptr_t>(p);
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    unsigned long begin = 0, end = 0;
    // A mapping's first line: "begin-end perms offset dev inode [path]".
    if (std::sscanf(line.c_str(), "%lx-%lx ", &begin, &end) == 2) {
      inside = address >= begin && address < end;
      continue;
    }
    unsigned long kib = 0;
    if (inside && std::sscanf(line.c_str(), "AnonHugePages: %lu kB", &kib) == 1) {
      return static_cast<int64_t>(kib) * 1024;
    }
  }
  return 0;
}

}  // namespace switchserve
