// OpenBLAS's own thread pool, which switchserve does not use.
//
// OpenBLAS's threaded build starts a pool of threads as the library loads,
// before main, sized by OPENBLAS_NUM_THREADS (else the cores). Nothing in
// switchserve runs on them: the CPU backend computes on its own worker pool
// and gives OpenBLAS one thread (cpu_backend.cc). They still cost: they spin
// on sched_yield for about 0.1 s after loading, taking a core from whatever
// starts then; and where the process's address space is limited (ulimit -v),
// a pool thread that cannot get its buffer retries for ever at full speed,
// and the exit joins it: a server that failed to start neither exited nor
// answered a stop signal.
#ifndef SWITCHSERVE_KERNELS_CPU_BLAS_THREADS_H_
#define SWITCHSERVE_KERNELS_CPU_BLAS_THREADS_H_

namespace switchserve::cpu {

// Unless OPENBLAS_NUM_THREADS is set, sets it to 1 and executes the program
// again in place of this one (the same process id, arguments and signal
// mask), so that OpenBLAS starts no pool. Returns only where it did not do
// so (the variable was set) or could not (the executable's path unreadable,
// execv failed): the program then goes on as it is.
void RestartWithoutBlasThreads(char** argv);

}  // namespace switchserve::cpu

#endif  // SWITCHSERVE_KERNELS_CPU_BLAS_THREADS_H_
