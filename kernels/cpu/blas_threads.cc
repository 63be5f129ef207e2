#include "kernels/cpu/blas_threads.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <system_error>

namespace switchserve::cpu {

void RestartWithoutBlasThreads(char** argv) {
  if (std::getenv("OPENBLAS_NUM_THREADS") != nullptr) return;
  // The program's own path, so that the process keeps its name.
  std::error_code error;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
  if (error || setenv("OPENBLAS_NUM_THREADS", "1", /*overwrite=*/1) != 0) return;
  execv(self.c_str(), argv);  // returns only if it failed
}

}  // namespace switchserve::cpu
