// model.safetensors: arbitrary bytes through the header and tensor-table
// checks. Whatever is accepted must be readable: every F32/F16/BF16 tensor
// reads back with as many values as its shape has elements.
#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/model/safetensors.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto file = switchserve::SafetensorsFile::FromBytes(
      std::string(reinterpret_cast<const char*>(data), size), "model.safetensors");
  if (!file.ok()) return 0;
  for (const auto& [name, info] : (*file)->tensors()) {
    FUZZ_CHECK(info.size_bytes == static_cast<size_t>(info.numel()) *
                                      static_cast<size_t>(switchserve::DTypeSize(info.dtype)));
    if (info.dtype == switchserve::DType::kI32 || info.dtype == switchserve::DType::kI64) continue;
    auto values = (*file)->ReadAsF32(name);
    FUZZ_CHECK(values.ok());
    FUZZ_CHECK(values->size() == static_cast<size_t>(info.numel()));
  }
  return 0;
}
