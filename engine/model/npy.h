// NumPy .npy files (format version 1.0) of little-endian float32, C order:
// `switchserve score --dump-logits` writes them so anyone can compare our
// logits with another implementation's in two lines of NumPy.
#ifndef SWITCHSERVE_ENGINE_MODEL_NPY_H_
#define SWITCHSERVE_ENGINE_MODEL_NPY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace switchserve {

absl::Status WriteNpyF32(const std::string& path, const std::vector<int64_t>& shape,
                         const std::vector<float>& data);

}  // namespace switchserve

#endif  // SWITCHSERVE_ENGINE_MODEL_NPY_H_
