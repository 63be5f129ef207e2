#include "kernels/cpu/kernel_isa.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace switchserve::cpu {

std::string_view ToString(KernelIsa isa) {
  switch (isa) {
    case KernelIsa::kGeneric:
      return "generic";
    case KernelIsa::kAvx2:
      return "avx2";
    case KernelIsa::kAvx512:
      return "avx512";
  }
  return "?";
}

bool CpuSupports(KernelIsa isa) {
  switch (isa) {
    case KernelIsa::kGeneric:
      return true;
    case KernelIsa::kAvx2:
#if defined(__x86_64__) || defined(__i386__)
      __builtin_cpu_init();
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
#else
      return false;
#endif
    case KernelIsa::kAvx512:
#if defined(__x86_64__) || defined(__i386__)
      return CpuSupports(KernelIsa::kAvx2) && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512vl");
#else
      return false;
#endif
  }
  return false;
}

absl::StatusOr<KernelIsa> ParseKernelIsa(std::string_view text) {
  for (KernelIsa isa : kAllKernelIsas) {
    if (text == ToString(isa)) return isa;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("\"", std::string(text), "\" is not a kernel build: generic, avx2 or avx512"));
}

std::vector<KernelIsa> SupportedKernelIsas() {
  std::vector<KernelIsa> out;
  for (KernelIsa isa : kAllKernelIsas) {
    if (CpuSupports(isa)) out.push_back(isa);
  }
  return out;
}

KernelIsa BestKernelIsa() {
  if (CpuSupports(KernelIsa::kAvx512)) return KernelIsa::kAvx512;
  return CpuSupports(KernelIsa::kAvx2) ? KernelIsa::kAvx2 : KernelIsa::kGeneric;
}

}  // namespace switchserve::cpu
