#include "kernels/cpu/matmul.h"

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

std::vector<KernelIsa> SupportedKernelIsas() {
  std::vector<KernelIsa> out;
  for (KernelIsa isa : {KernelIsa::kGeneric, KernelIsa::kAvx2, KernelIsa::kAvx512}) {
    if (CpuSupports(isa)) out.push_back(isa);
  }
  return out;
}

KernelIsa BestKernelIsa() {
  if (CpuSupports(KernelIsa::kAvx512)) return KernelIsa::kAvx512;
  return CpuSupports(KernelIsa::kAvx2) ? KernelIsa::kAvx2 : KernelIsa::kGeneric;
}

WeightMatrix MatrixOf(const Tensor& tensor, int64_t ld, int64_t offset) {
  WeightMatrix m;
  m.dtype = tensor.dtype();
  m.data = static_cast<const char*>(tensor.raw()) + offset * DTypeSize(tensor.dtype());
  m.ld = ld;
  return m;
}

const MatmulKernels& KernelsFor(KernelIsa isa) {
#if defined(__x86_64__) || defined(__i386__)
  if (isa == KernelIsa::kAvx2) return Avx2Kernels();
  if (isa == KernelIsa::kAvx512) return Avx512Kernels();
#endif
  return GenericKernels();
}

}  // namespace switchserve::cpu
