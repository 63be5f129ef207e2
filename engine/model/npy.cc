#include "engine/model/npy.h"

#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace switchserve {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicSize = 6;
constexpr size_t kPreambleSize = kMagicSize + 2 + 2;  // magic, version, header length

absl::Status ParseShape(absl::string_view header, std::vector<int64_t>* shape) {
  const size_t key = header.find("'shape':");
  const size_t open = header.find('(', key);
  const size_t close = header.find(')', open);
  if (key == absl::string_view::npos || open == absl::string_view::npos ||
      close == absl::string_view::npos) {
    return absl::InvalidArgumentError("npy: header has no shape");
  }
  for (absl::string_view part :
       absl::StrSplit(header.substr(open + 1, close - open - 1), ',', absl::SkipWhitespace())) {
    int64_t dim = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &dim) || dim < 0) {
      return absl::InvalidArgumentError(absl::StrCat("npy: bad shape entry \"", part, "\""));
    }
    shape->push_back(dim);
  }
  return absl::OkStatus();
}

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

  std::ofstream out(path, std::ios::binary | std::ios::trunc);
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
  if (!out) return absl::DataLossError(absl::StrCat(path, ": write failed"));
  return absl::OkStatus();
}

absl::StatusOr<NpyArray> ReadNpyF32(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string bytes = buffer.str();
  if (bytes.size() < kPreambleSize || std::memcmp(bytes.data(), kMagic, kMagicSize) != 0 ||
      bytes[6] != 1) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a version 1 .npy file"));
  }
  const size_t header_size =
      static_cast<uint8_t>(bytes[8]) | (static_cast<size_t>(static_cast<uint8_t>(bytes[9])) << 8);
  if (kPreambleSize + header_size > bytes.size()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": truncated header"));
  }
  const absl::string_view header(bytes.data() + kPreambleSize, header_size);
  if (header.find("'descr': '<f4'") == absl::string_view::npos ||
      header.find("'fortran_order': False") == absl::string_view::npos) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": expected C-order '<f4' data"));
  }
  NpyArray array;
  absl::Status status = ParseShape(header, &array.shape);
  if (!status.ok()) return status;
  int64_t numel = 1;
  for (int64_t dim : array.shape) numel *= dim;
  const size_t data_offset = kPreambleSize + header_size;
  if (bytes.size() - data_offset != static_cast<size_t>(numel) * sizeof(float)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": shape needs ", numel * sizeof(float),
                                                   " data bytes, file has ",
                                                   bytes.size() - data_offset));
  }
  array.data.resize(numel);
  std::memcpy(array.data.data(), bytes.data() + data_offset, numel * sizeof(float));
  return array;
}

}  // namespace switchserve
