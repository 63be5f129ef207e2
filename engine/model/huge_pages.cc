#include "engine/model/huge_pages.h"

#include <sys/mman.h>

#include <cstdint>
#include <new>

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

}  // namespace switchserve
