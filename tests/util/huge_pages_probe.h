// What the kernel backs with transparent huge pages, read from /proc: for the
// tests that check which allocations land on them (engine/model/huge_pages.h).
#ifndef SWITCHSERVE_TESTS_UTIL_HUGE_PAGES_PROBE_H_
#define SWITCHSERVE_TESTS_UTIL_HUGE_PAGES_PROBE_H_

#include <cstdint>
#include <string>

namespace switchserve::testing {

// The kernel's THP mode: the bracketed word of
// /sys/kernel/mm/transparent_hugepage/enabled ("never" where it is absent).
std::string ThpMode();

// The bytes of the mapping holding `p` that the kernel backs with huge pages
// (AnonHugePages in /proc/self/smaps; 0 where that cannot be read).
int64_t HugePageBytesOfMapping(const void* p);

// The bytes of this process backed by anonymous huge pages (AnonHugePages in
// /proc/self/smaps_rollup; 0 where that cannot be read).
int64_t ProcessHugePageBytes();

}  // namespace switchserve::testing

#endif  // SWITCHSERVE_TESTS_UTIL_HUGE_PAGES_PROBE_H_
