#include "engine/model/npy.h"

#include <filesystem>
#include <fstream>
#include <system_error>

#include "absl/strings/str_cat.h"

namespace switchserve {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicSize = 6;
constexpr size_t kPreambleSize = kMagicSize + 2 + 2;  // magic, version, header length

}  // namespace

absl::Status WriteNpyF32(const std::string& path, const std::vector<int64_t>& shape,
                         const std::vector<float>& data) {
  int64_t numel = 1;
  std::string dims;  // "3, 4" for 2-D, "3," for 1-D (a Python tuple)
  for (size_t i = 0; i < shape.size(); ++i) {
    numel *= shape[i];
    absl::StrAppend(&dims, i == 0 ? "" : ", ", shape[i]);
  }
  if (shape.size() == 1) dims.push_back(',');
  if (numel != static_cast<int64_t>(data.size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("npy: shape holds ", numel, " values, data has ", data.size()));
  }
  std::string header =
      absl::StrCat("{'descr': '<f4', 'fortran_order': False, 'shape': (", dims, "), }");
  const size_t unpadded = kPreambleSize + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header.push_back('\n');

  // A regular file (or a new one) is written beside its path and renamed
  // over it once complete: a failed write leaves no truncated array, and a
  // good file there stays until the new one is whole. Anything else (a
  // device, a pipe) is written in place.
  std::error_code error;
  const bool in_place =
      std::filesystem::exists(path, error) && !std::filesystem::is_regular_file(path, error);
  const std::string written = in_place ? path : path + ".partial";
  std::ofstream out(written, std::ios::binary | std::ios::trunc);
  if (!out) return absl::NotFoundError(absl::StrCat(path, ": cannot open for writing"));
  const uint16_t header_size = static_cast<uint16_t>(header.size());
  out.write(kMagic, kMagicSize);
  out.put(1);
  out.put(0);
  out.put(static_cast<char>(header_size & 0xff));
  out.put(static_cast<char>(header_size >> 8));
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(reinterpret_cast<const char*>(data.data()),
            static_cast<std::streamsize>(data.size() * sizeof(float)));
  out.close();
  if (!out) {
    if (!in_place) std::filesystem::remove(written, error);
    return absl::DataLossError(absl::StrCat(path, ": write failed"));
  }
  if (!in_place) {
    std::filesystem::rename(written, path, error);
    if (error) {
      std::filesystem::remove(written, error);
      return absl::DataLossError(absl::StrCat(path, ": cannot replace it: ", error.message()));
    }
  }
  return absl::OkStatus();
}

}  // namespace switchserve
