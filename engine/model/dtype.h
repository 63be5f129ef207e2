// Element types of stored tensors (safetensors dtypes) and the f16 / bf16
// conversions. Narrowing rounds to nearest even; widening is exact.
#ifndef SWITCHSERVE_ENGINE_MODEL_DTYPE_H_
#define SWITCHSERVE_ENGINE_MODEL_DTYPE_H_

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
uint16_t FloatToBFloat16(float f);

}  // namespace switchserve

#endif  // SWITCHSERVE_ENGINE_MODEL_DTYPE_H_
