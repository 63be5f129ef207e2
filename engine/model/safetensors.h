// A read-only, memory-mapped safetensors file (8-byte little-endian header
// length, JSON header, raw little-endian tensor data). Open validates the
// whole header: dtypes, shapes vs byte sizes, offsets inside the file and not
// overlapping. The mapping lives as long as the SafetensorsFile.
#ifndef SWITCHSERVE_ENGINE_MODEL_SAFETENSORS_H_
#define SWITCHSERVE_ENGINE_MODEL_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/dtype.h"

namespace switchserve {

struct TensorInfo {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const std::byte* data = nullptr;  // inside the mapping; may be unaligned
  size_t size_bytes = 0;
  int64_t numel() const;
};

class SafetensorsFile {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  // The same checks on the bytes of a file held in memory; `name` stands for
  // the path in messages (fuzzing, tests).
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> FromBytes(std::string bytes,
                                                                    std::string name);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  // nullptr when absent.
  const TensorInfo* Find(const std::string& name) const;
  const std::map<std::string, TensorInfo>& tensors() const { return tensors_; }
  // Copies tensor `name` widened to f32 (F32, F16, BF16 only).
  absl::StatusOr<std::vector<float>> ReadAsF32(const std::string& name) const;

 private:
  SafetensorsFile() = default;
  // Validates the header of `file_size` bytes at `bytes` (which the object
  // owns or maps) and fills tensors_.
  absl::Status ParseContents(const std::byte* bytes, uint64_t file_size);

  std::string path_;
  void* map_ = nullptr;  // Open's mapping, or null
  size_t map_size_ = 0;
  std::string owned_;  // FromBytes' copy
  std::map<std::string, TensorInfo> tensors_;
};

// Writes tensors (f32 data, stored as `dtype`, F32/F16/BF16) to `path`.
struct TensorToWrite {
  std::string name;
  std::vector<int64_t> shape;
  const float* data = nullptr;
  DType dtype = DType::kF32;
};
absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors);

}  // namespace switchserve

#endif  // SWITCHSERVE_ENGINE_MODEL_SAFETENSORS_H_
