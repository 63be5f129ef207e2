// What a fuzz target does when a property it checks fails: print it and
// abort, so libFuzzer records the input as a crash.
#ifndef SWITCHSERVE_TESTS_FUZZ_FUZZ_CHECK_H_
#define SWITCHSERVE_TESTS_FUZZ_FUZZ_CHECK_H_

#include <cstdio>
#include <cstdlib>

#define FUZZ_CHECK(condition)                                                               \
  do {                                                                                      \
    if (!(condition)) {                                                                     \
      std::fprintf(stderr, "%s:%d: property failed: %s\n", __FILE__, __LINE__, #condition); \
      std::abort();                                                                         \
    }                                                                                       \
  } while (0)

#endif  // SWITCHSERVE_TESTS_FUZZ_FUZZ_CHECK_H_
