// When SIMT_LAUNCH_DEPENDENT (simt.h) makes a dependent launch on a GPU: on a
// device of compute capability 9.0 or later, from a thread inside a
// ScopedDependentLaunch(true), unless SWITCHSERVE_CUDA_DEPENDENT_LAUNCH=0.
// Plain C++, so that host code compiled by g++ sets the policy for the kernels
// it launches. The executor holds every SIMT_LAUNCH_DEPENDENT kernel to its
// SIMT_GRID_WAIT() whatever the policy.
#ifndef SWITCHSERVE_KERNELS_CUDA_DEPENDENT_LAUNCH_H_
#define SWITCHSERVE_KERNELS_CUDA_DEPENDENT_LAUNCH_H_

namespace simt {

// Dependent launches from this thread while it lives (or not); scopes nest.
class ScopedDependentLaunch {
 public:
  explicit ScopedDependentLaunch(bool enabled);
  ~ScopedDependentLaunch();
  ScopedDependentLaunch(const ScopedDependentLaunch&) = delete;
  ScopedDependentLaunch& operator=(const ScopedDependentLaunch&) = delete;

 private:
  bool previous_;
};

// Whether this thread's launches are dependent now (the scope only; the
// device and the environment are simt.h's to check).
bool DependentLaunchRequested();

}  // namespace simt

#endif  // SWITCHSERVE_KERNELS_CUDA_DEPENDENT_LAUNCH_H_
