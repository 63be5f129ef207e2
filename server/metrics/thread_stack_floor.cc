// Gives civetweb's threads (the metrics exposer's) room to run in this binary.
//
// Debian's libcivetweb is built with USE_STACK_SIZE=102400: it creates every
// worker thread with pthread_attr_setstacksize(100 KiB). glibc carves each
// thread's static TLS out of that stack, and switchserve's static TLS is
// large (OpenBLAS alone has 60 KiB), which leaves a scrape too little stack:
// it overflows inside mg_printf and the process dies with SIGSEGV. Under
// AddressSanitizer 100 KiB is too little even without OpenBLAS.
//
// This definition interposes on glibc's for the whole process (the
// executable exports it, see server/metrics/CMakeLists.txt) and raises requests below
// kMinStackBytes to that floor; larger requests pass through unchanged.
#include <dlfcn.h>
#include <pthread.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>

namespace {

constexpr size_t kMinStackBytes = size_t{1} << 20;

using SetStackSize = int (*)(pthread_attr_t*, size_t);

SetStackSize RealSetStackSize() {
  static const SetStackSize real =
      reinterpret_cast<SetStackSize>(dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
  return real;
}

}  // namespace

extern "C" int pthread_attr_setstacksize(pthread_attr_t* attr, size_t stack_size) {
  const SetStackSize real = RealSetStackSize();
  if (real == nullptr) return ENOSYS;
  return real(attr, std::max(stack_size, kMinStackBytes));
}
