// The instruction-set builds of the CPU backend's kernels (matmul.h), and
// which of them this CPU can run. A backend picks one at creation, the
// fastest by default (BestKernelIsa) or the one its options name
// (CpuBackendOptions::kernel_isa, the server's --cpu-kernels).
#ifndef SWITCHSERVE_KERNELS_CPU_KERNEL_ISA_H_
#define SWITCHSERVE_KERNELS_CPU_KERNEL_ISA_H_

#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace switchserve::cpu {

enum class KernelIsa {
  kGeneric,  // any x86-64 (or other) CPU: plain C++, no fused multiply-add
  kAvx2,     // AVX2 + FMA + F16C
  kAvx512,   // the same operations with AVX-512VL's 32 registers: kAvx2's bits, faster
};
// Every build, kGeneric first.
inline constexpr KernelIsa kAllKernelIsas[] = {KernelIsa::kGeneric, KernelIsa::kAvx2,
                                               KernelIsa::kAvx512};
std::string_view ToString(KernelIsa isa);  // "generic", "avx2", "avx512"
// The inverse of ToString; INVALID_ARGUMENT names the accepted values.
absl::StatusOr<KernelIsa> ParseKernelIsa(std::string_view text);
// Whether this CPU can run `isa`.
bool CpuSupports(KernelIsa isa);
// The fastest build this CPU supports.
KernelIsa BestKernelIsa();
// Every build this CPU supports, kGeneric first.
std::vector<KernelIsa> SupportedKernelIsas();

}  // namespace switchserve::cpu

#endif  // SWITCHSERVE_KERNELS_CPU_KERNEL_ISA_H_
