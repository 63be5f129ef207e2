// Element types of stored tensors (safetensors dtypes) and the f16 / bf16
// conversions. Narrowing rounds to nearest even; widening is exact.
#ifndef SWITCHSERVE_ENGINE_MODEL_DTYPE_H_
#define SWITCHSERVE_ENGINE_MODEL_DTYPE_H_

#include <bit>
#include <cstdint>
#include <string_view>

namespace switchserve {

enum class DType { kF32, kF16, kBF16, kI32, kI64 };
std::string_view ToString(DType dtype);  // "F32", "F16", ...
int DTypeSize(DType dtype);              // bytes per element

// f16 / bf16 conversions (round to nearest even).
float HalfToFloat(uint16_t h);
float BFloat16ToFloat(uint16_t b);
uint16_t FloatToHalf(float f);

// Inline and branch-free, so that a loop over a row (the KV cache's stores)
// vectorizes. NaN keeps its sign and is made quiet.
inline uint16_t FloatToBFloat16(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (bits >> 16) | 0x0040u;
  return static_cast<uint16_t>((bits & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

}  // namespace switchserve

#endif  // SWITCHSERVE_ENGINE_MODEL_DTYPE_H_
