#include "engine/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/model/json_text.h"

namespace switchserve {
namespace {

constexpr uint64_t kHeaderLengthBytes = 8;
// Real headers are a few hundred KiB at most; a larger claim is corruption.
constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;

bool ParseDType(const std::string& text, DType* dtype) {
  static const std::pair<const char*, DType> kNames[] = {
      {"F32", DType::kF32}, {"F16", DType::kF16}, {"BF16", DType::kBF16},
      {"I32", DType::kI32}, {"I64", DType::kI64},
  };
  for (const auto& [name, value] : kNames) {
    if (text == name) {
      *dtype = value;
      return true;
    }
  }
  return false;
}

std::string ErrnoText() { return std::strerror(errno); }

// Reads a JSON array of non-negative integers that fit in int64.
bool ReadUnsignedArray(const nlohmann::json& value, std::vector<uint64_t>* out) {
  if (!value.is_array()) return false;
  out->clear();
  for (const nlohmann::json& element : value) {
    if (!element.is_number_integer()) return false;
    if (element.is_number_unsigned()) {
      const uint64_t v = element.get<uint64_t>();
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
      out->push_back(v);
    } else {
      const int64_t v = element.get<int64_t>();
      if (v < 0) return false;
      out->push_back(static_cast<uint64_t>(v));
    }
  }
  return true;
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Validates one header entry and fills `info` (data pointer relative to the
// data section start, patched by the caller). `begin`/`end` are byte offsets
// into the data section.
absl::Status ParseEntry(const std::string& where, const nlohmann::json& entry, uint64_t data_size,
                        TensorInfo* info, uint64_t* begin, uint64_t* end) {
  if (!entry.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": expected an object, found ", DescribeJson(entry)));
  }
  for (const auto& [key, value] : entry.items()) {
    if (key != "dtype" && key != "shape" && key != "data_offsets") {
      return absl::InvalidArgumentError(absl::StrCat(where, ": unknown key \"", key, "\""));
    }
  }
  for (const char* key : {"dtype", "shape", "data_offsets"}) {
    if (!entry.contains(key)) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": missing \"", key, "\""));
    }
  }
  const nlohmann::json& dtype = entry["dtype"];
  if (!dtype.is_string() || !ParseDType(dtype.get<std::string>(), &info->dtype)) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": unsupported dtype ",
                                                   DescribeJson(dtype),
                                                   " (expected F32, F16, BF16, I32 or I64)"));
  }
  std::vector<uint64_t> dims;
  if (!ReadUnsignedArray(entry["shape"], &dims)) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": shape: expected an array of non-negative integers, found ",
                     DescribeJson(entry["shape"])));
  }
  // numel * dtype size, refusing anything that would overflow 64 bits.
  uint64_t expected_bytes = static_cast<uint64_t>(DTypeSize(info->dtype));
  bool overflow = false;
  info->shape.clear();
  for (uint64_t dim : dims) {
    info->shape.push_back(static_cast<int64_t>(dim));
    if (dim != 0 && expected_bytes > std::numeric_limits<uint64_t>::max() / dim) overflow = true;
    expected_bytes *= dim;
  }
  std::vector<uint64_t> offsets;
  if (!ReadUnsignedArray(entry["data_offsets"], &offsets) || offsets.size() != 2 ||
      offsets[0] > offsets[1]) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, ": data_offsets: expected [begin, end] with 0 <= begin <= end, found ",
                     DescribeJson(entry["data_offsets"])));
  }
  *begin = offsets[0];
  *end = offsets[1];
  if (*end > data_size) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": data_offsets [", *begin, ", ", *end,
                                                   "] run past the end of the data section (",
                                                   data_size, " bytes; file truncated?)"));
  }
  const uint64_t span = *end - *begin;
  if (overflow || expected_bytes != span) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, ": shape ", ShapeText(info->shape), " of ", std::string(ToString(info->dtype)),
        " needs ", overflow ? std::string("more than 2^64") : absl::StrCat(expected_bytes),
        " bytes, but data_offsets [", *begin, ", ", *end, "] span ", span));
  }
  info->size_bytes = static_cast<size_t>(span);
  return absl::OkStatus();
}

}  // namespace

int64_t TensorInfo::numel() const {
  int64_t n = 1;  // a scalar (shape []) has one element
  for (int64_t dim : shape) n *= dim;
  return n;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer (it is then
  // refused as not a regular file); it changes nothing for regular files.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat(path, ": not found"));
    return absl::InvalidArgumentError(absl::StrCat(path, ": cannot open: ", ErrnoText()));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < kHeaderLengthBytes) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": file is ", file_size, " bytes, too short for the 8-byte header length"));
  }
  void* map = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);  // the mapping keeps the file alive
  if (map == MAP_FAILED) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": mmap failed: ", ErrnoText()));
  }
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->map_ = map;
  file->map_size_ = file_size;
  if (absl::Status status = file->ParseContents(static_cast<const std::byte*>(map), file_size);
      !status.ok()) {
    return status;
  }
  return file;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::FromBytes(std::string bytes,
                                                                            std::string name) {
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = std::move(name);
  file->owned_ = std::move(bytes);
  if (file->owned_.size() < kHeaderLengthBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(file->path_, ": file is ", file->owned_.size(),
                     " bytes, too short for the 8-byte header length"));
  }
  if (absl::Status status = file->ParseContents(
          reinterpret_cast<const std::byte*>(file->owned_.data()), file->owned_.size());
      !status.ok()) {
    return status;
  }
  return file;
}

absl::Status SafetensorsFile::ParseContents(const std::byte* bytes, uint64_t file_size) {
  const std::string& path = path_;

  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i) {
    header_size = (header_size << 8) | std::to_integer<uint64_t>(bytes[i]);
  }
  if (header_size > file_size - kHeaderLengthBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": header length ", header_size, " is larger than the ",
                     file_size - kHeaderLengthBytes, " bytes after the length field"));
  }
  if (header_size > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": header length ", header_size,
                                                   " exceeds the limit of ", kMaxHeaderBytes));
  }
  const std::string_view header_text(reinterpret_cast<const char*>(bytes + kHeaderLengthBytes),
                                     static_cast<size_t>(header_size));
  absl::StatusOr<nlohmann::json> header = ParseJsonText(header_text, path + " (header)");
  if (!header.ok()) return header.status();
  if (!header->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": header: expected a JSON object, found ", DescribeJson(*header)));
  }
  const std::byte* data = bytes + kHeaderLengthBytes + header_size;
  const uint64_t data_size = file_size - kHeaderLengthBytes - header_size;

  struct Extent {
    uint64_t begin, end;
    std::string name;
  };
  std::vector<Extent> extents;
  for (const auto& [name, entry] : header->items()) {
    if (name == "__metadata__") {
      // Free-form string -> string map (safetensors convention).
      bool ok = entry.is_object();
      if (ok) {
        for (const auto& [key, value] : entry.items()) ok = ok && value.is_string();
      }
      if (!ok) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, ": __metadata__: expected an object of strings"));
      }
      continue;
    }
    TensorInfo info;
    uint64_t begin = 0, end = 0;
    absl::Status status =
        ParseEntry(absl::StrCat(path, ": tensor ", name), entry, data_size, &info, &begin, &end);
    if (!status.ok()) return status;
    info.data = data + begin;
    extents.push_back({begin, end, name});
    tensors_.emplace(name, std::move(info));
  }
  std::sort(extents.begin(), extents.end(), [](const Extent& a, const Extent& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  // Sorted by begin, a tensor overlaps an earlier one exactly when it starts
  // before the furthest end seen so far. Empty tensors occupy no bytes.
  const Extent* furthest = nullptr;
  for (const Extent& cur : extents) {
    if (cur.begin == cur.end) continue;
    if (furthest != nullptr && cur.begin < furthest->end) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": tensor ", cur.name, ": data_offsets [", cur.begin, ", ", cur.end,
          "] overlap tensor ", furthest->name, " [", furthest->begin, ", ", furthest->end, "]"));
    }
    if (furthest == nullptr || cur.end > furthest->end) furthest = &cur;
  }
  return absl::OkStatus();
}

SafetensorsFile::~SafetensorsFile() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
}

const TensorInfo* SafetensorsFile::Find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

absl::StatusOr<std::vector<float>> SafetensorsFile::ReadAsF32(const std::string& name) const {
  const TensorInfo* info = Find(name);
  if (info == nullptr) {
    return absl::NotFoundError(absl::StrCat(path_, ": missing tensor ", name));
  }
  const size_t count = info->size_bytes / static_cast<size_t>(DTypeSize(info->dtype));
  std::vector<float> out(count);
  switch (info->dtype) {
    case DType::kF32:
      if (count > 0) std::memcpy(out.data(), info->data, count * sizeof(float));
      return out;
    case DType::kF16:
    case DType::kBF16: {
      const bool half = info->dtype == DType::kF16;
      for (size_t i = 0; i < count; ++i) {
        uint16_t bits;  // the data may be unaligned: copy, don't cast
        std::memcpy(&bits, info->data + 2 * i, sizeof(bits));
        out[i] = half ? HalfToFloat(bits) : BFloat16ToFloat(bits);
      }
      return out;
    }
    case DType::kI32:
    case DType::kI64:
      break;
  }
  return absl::InvalidArgumentError(absl::StrCat(path_, ": tensor ", name,
                                                 ": expected dtype F32, F16 or BF16, found ",
                                                 std::string(ToString(info->dtype))));
}

absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  header["__metadata__"] = {{"format", "pt"}};
  std::set<std::string> names;
  uint64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    const std::string where = absl::StrCat(path, ": tensor ", t.name);
    if (t.name.empty() || t.name == "__metadata__" || !names.insert(t.name).second) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": empty, reserved or repeated name"));
    }
    if (t.dtype != DType::kF32 && t.dtype != DType::kF16 && t.dtype != DType::kBF16) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": cannot write dtype ", std::string(ToString(t.dtype)), " from f32 data"));
    }
    uint64_t numel = 1;
    for (int64_t dim : t.shape) {
      if (dim < 0) return absl::InvalidArgumentError(absl::StrCat(where, ": negative dimension"));
      numel *= static_cast<uint64_t>(dim);
    }
    if (numel > 0 && t.data == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": no data"));
    }
    const uint64_t bytes = numel * static_cast<uint64_t>(DTypeSize(t.dtype));
    header[t.name] = {{"dtype", std::string(ToString(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string header_text;
  try {
    header_text = header.dump();
  } catch (const nlohmann::json::exception& e) {  // e.g. a name that is not UTF-8
    return absl::InvalidArgumentError(absl::StrCat(path, ": cannot write header: ", e.what()));
  }
  // Pad with spaces so the data section starts 8-byte aligned.
  header_text.append((8 - header_text.size() % 8) % 8, ' ');

  const std::string tmp_path = path + ".tmp";
  std::FILE* out = std::fopen(tmp_path.c_str(), "wb");
  if (out == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(tmp_path, ": cannot create: ", ErrnoText()));
  }
  bool ok = true;
  auto put = [&](const void* p, size_t n) {
    ok = ok && (n == 0 || std::fwrite(p, 1, n, out) == n);
  };
  unsigned char length[8];
  for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(header_text.size() >> (8 * i));
  put(length, sizeof(length));
  put(header_text.data(), header_text.size());
  std::vector<uint16_t> narrow;
  for (const TensorToWrite& t : tensors) {
    size_t numel = 1;
    for (int64_t dim : t.shape) numel *= static_cast<size_t>(dim);
    if (t.dtype == DType::kF32) {
      put(t.data, numel * sizeof(float));
      continue;
    }
    narrow.resize(numel);
    for (size_t i = 0; i < numel; ++i) {
      narrow[i] = t.dtype == DType::kF16 ? FloatToHalf(t.data[i]) : FloatToBFloat16(t.data[i]);
    }
    put(narrow.data(), numel * sizeof(uint16_t));
  }
  ok = (std::fclose(out) == 0) && ok;
  if (!ok || std::rename(tmp_path.c_str(), path.c_str()) != 0) {
    const std::string reason = ErrnoText();
    std::remove(tmp_path.c_str());
    return absl::InvalidArgumentError(absl::StrCat(path, ": write failed: ", reason));
  }
  return absl::OkStatus();
}

}  // namespace switchserve
