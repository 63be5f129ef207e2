#include "engine/model/dtype.h"

#include <bit>
#include <cmath>

namespace switchserve {

std::string_view ToString(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kI32:
      return "I32";
    case DType::kI64:
      return "I64";
  }
  return "?";
}

uint16_t FloatToHalf(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  const uint32_t magnitude = bits & 0x7fffffff;
  if (magnitude >= 0x7f800000) {  // inf, or nan (made quiet, top payload bits kept)
    if (magnitude == 0x7f800000) return sign | 0x7c00;
    return sign | 0x7e00 | static_cast<uint16_t>((magnitude >> 13) & 0x3ff);
  }
  // 65520 is halfway between 65504 (largest half) and 65536; ties go to the
  // even neighbour, which is infinity.
  if (magnitude >= 0x477ff000) return sign | 0x7c00;
  if (magnitude < 0x38800000) {                // below 2^-14: half subnormal (units of 2^-24)
    if (magnitude <= 0x33000000) return sign;  // <= 2^-25 rounds to zero (tie to even)
    const uint32_t exponent = magnitude >> 23;
    const uint32_t mantissa = (magnitude & 0x7fffff) | 0x800000;
    const uint32_t shift = 126 - exponent;  // 14..24
    uint32_t result = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rest > halfway || (rest == halfway && (result & 1))) ++result;
    return sign | static_cast<uint16_t>(result);  // may carry into the smallest normal
  }
  uint32_t result = ((magnitude >> 23) - 112) << 10 | ((magnitude >> 13) & 0x3ff);
  const uint32_t rest = magnitude & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (result & 1))) ++result;  // carry may bump the exponent
  return sign | static_cast<uint16_t>(result);
}

}  // namespace switchserve
