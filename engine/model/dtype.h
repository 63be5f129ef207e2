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
// Bytes per element. Inline: the CPU kernels ask it for every tile.
constexpr int DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
      return 2;
    case DType::kI64:
      return 8;
  }
  return 0;
}

// f16 / bf16 conversions (round to nearest even). The widenings and the bf16
// narrowing are inline and branch-free, so that a loop over a row (an
// embedding's lookup, the KV cache's stores) vectorizes.
inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exponent = (h >> 10) & 0x1f;
  const uint32_t mantissa = h & 0x3ffu;
  // Zero or subnormal: mantissa * 2^-24, exact in f32.
  const uint32_t small = std::bit_cast<uint32_t>(static_cast<float>(mantissa) * 0x1p-24f);
  const uint32_t special = 0x7f800000u | (mantissa << 13);  // inf or nan (payload kept)
  const uint32_t normal = ((exponent + 112) << 23) | (mantissa << 13);
  return std::bit_cast<float>(sign |
                              (exponent == 0 ? small : (exponent == 0x1f ? special : normal)));
}
inline float BFloat16ToFloat(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}
uint16_t FloatToHalf(float f);
// NaN keeps its sign and is made quiet.
inline uint16_t FloatToBFloat16(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (bits >> 16) | 0x0040u;
  return static_cast<uint16_t>((bits & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

}  // namespace switchserve

#endif  // SWITCHSERVE_ENGINE_MODEL_DTYPE_H_
