#include "kernels/cuda/dependent_launch.h"

namespace simt {
namespace {

thread_local bool requested = false;

}  // namespace

ScopedDependentLaunch::ScopedDependentLaunch(bool enabled) : previous_(requested) {
  requested = enabled;
}

ScopedDependentLaunch::~ScopedDependentLaunch() { requested = previous_; }

bool DependentLaunchRequested() { return requested; }

}  // namespace simt
