// SWITCHSERVE_TARGET_CLONES(...): GCC's target_clones (one copy of a
// function per instruction set, picked at load time by an ifunc resolver),
// except under ThreadSanitizer. The resolver is instrumented like any other
// function and runs while the dynamic loader relocates the binary, before
// TSan's runtime is set up: a TSan binary with an ifunc crashed (SIGSEGV)
// before main. Under TSan the portable ("default") body is the only one.
#ifndef SWITCHSERVE_KERNELS_CPU_TARGET_CLONES_H_
#define SWITCHSERVE_KERNELS_CPU_TARGET_CLONES_H_

#if defined(__SANITIZE_THREAD__)
#define SWITCHSERVE_TARGET_CLONES(...)
#else
#define SWITCHSERVE_TARGET_CLONES(...) __attribute__((target_clones(__VA_ARGS__)))
#endif

#endif  // SWITCHSERVE_KERNELS_CPU_TARGET_CLONES_H_
