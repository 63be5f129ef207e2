#include "engine/text/sentencepiece_model.h"

#include <dlfcn.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/text/sentencepiece_bridge.h"

namespace switchserve {

// The bridge's entry points, resolved once.
struct SentencePieceBridge {
  std::string path;
  decltype(&switchserve_spm_load) load = nullptr;
  decltype(&switchserve_spm_free) free = nullptr;
  decltype(&switchserve_spm_piece_size) piece_size = nullptr;
  decltype(&switchserve_spm_encode) encode = nullptr;
  decltype(&switchserve_spm_decode) decode = nullptr;
  decltype(&switchserve_spm_piece_bytes) piece_bytes = nullptr;
};

namespace {

constexpr char kBridgeFile[] = "libswitchserve_sentencepiece.so";
constexpr size_t kErrorSize = 512;

// Where the bridge may be: beside an installed binary (bin/ and
// lib/switchserve/ under one prefix, as in the container images), then the
// build tree that built this binary.
std::vector<std::string> BridgeCandidates() {
  std::vector<std::string> candidates;
  std::error_code error;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", error);
  if (!error) {
    candidates.push_back((exe.parent_path().parent_path() / "lib" / "switchserve" / kBridgeFile)
                             .lexically_normal()
                             .string());
  }
#ifdef SWITCHSERVE_SENTENCEPIECE_BRIDGE_PATH
  // The build tree puts it where an installed binary looks: named once.
  if (candidates.empty() || candidates[0] != SWITCHSERVE_SENTENCEPIECE_BRIDGE_PATH) {
    candidates.push_back(SWITCHSERVE_SENTENCEPIECE_BRIDGE_PATH);
  }
#endif
  return candidates;
}

template <typename F>
bool Resolve(void* library, const char* name, F* out) {
  *out = reinterpret_cast<F>(dlsym(library, name));
  return *out != nullptr;
}

absl::StatusOr<SentencePieceBridge> LoadBridge() {
  const std::vector<std::string> candidates = BridgeCandidates();
  std::vector<std::string> problems;
  for (const std::string& path : candidates) {
    if (access(path.c_str(), R_OK) != 0) {
      problems.push_back(absl::StrCat(path, ": not found"));
      continue;
    }
    // A namespace of its own: the bridge's libsentencepiece brings a
    // protobuf that must not meet the process's (sentencepiece_bridge.h).
    void* library = dlmopen(LM_ID_NEWLM, path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) {
      const char* reason = dlerror();
      problems.push_back(absl::StrCat(path, ": ", reason != nullptr ? reason : "dlmopen failed"));
      continue;
    }
    decltype(&switchserve_spm_bridge_version) version = nullptr;
    SentencePieceBridge bridge;
    bridge.path = path;
    if (!Resolve(library, "switchserve_spm_bridge_version", &version) ||
        version() != SWITCHSERVE_SPM_BRIDGE_VERSION ||
        !Resolve(library, "switchserve_spm_load", &bridge.load) ||
        !Resolve(library, "switchserve_spm_free", &bridge.free) ||
        !Resolve(library, "switchserve_spm_piece_size", &bridge.piece_size) ||
        !Resolve(library, "switchserve_spm_encode", &bridge.encode) ||
        !Resolve(library, "switchserve_spm_decode", &bridge.decode) ||
        !Resolve(library, "switchserve_spm_piece_bytes", &bridge.piece_bytes)) {
      problems.push_back(absl::StrCat(path, ": not a version ", SWITCHSERVE_SPM_BRIDGE_VERSION,
                                      " SentencePiece bridge"));
      continue;  // the namespace stays: it cannot be unloaded cleanly
    }
    return bridge;
  }
  return absl::FailedPreconditionError(
      absl::StrCat("SentencePiece support (", kBridgeFile,
                   ") cannot be loaded: ", absl::StrJoin(problems, "; ")));
}

// Loaded on first use, once per process; never unloaded.
const absl::StatusOr<SentencePieceBridge>& Bridge() {
  static const auto* const bridge = new absl::StatusOr<SentencePieceBridge>(LoadBridge());
  return *bridge;
}

std::string ErrorText(const std::array<char, kErrorSize>& error) {
  return error[0] == '\0' ? std::string("unknown error") : std::string(error.data());
}

}  // namespace

absl::StatusOr<std::string> SentencePieceBridgePath() {
  if (!Bridge().ok()) return Bridge().status();
  return Bridge()->path;
}

SentencePieceModel::SentencePieceModel(const SentencePieceBridge* bridge, void* handle)
    : bridge_(bridge), handle_(handle), piece_size_(bridge->piece_size(handle)) {}

SentencePieceModel::~SentencePieceModel() { bridge_->free(handle_); }

absl::StatusOr<std::unique_ptr<SentencePieceModel>> SentencePieceModel::Load(
    const std::string& path) {
  const absl::StatusOr<SentencePieceBridge>& bridge = Bridge();
  if (!bridge.ok()) return bridge.status();
  std::array<char, kErrorSize> error{};
  void* handle = bridge->load(path.c_str(), error.data(), error.size());
  if (handle == nullptr) return absl::InvalidArgumentError(ErrorText(error));
  std::unique_ptr<SentencePieceModel> model(new SentencePieceModel(&*bridge, handle));
  if (absl::Status pieces = model->LoadPieceBytes(); !pieces.ok()) return pieces;
  return model;
}

absl::Status SentencePieceModel::LoadPieceBytes() {
  std::string piece(64, '\0');
  for (const bool first : {false, true}) {
    PieceTable& table = first ? first_ : after_text_;
    table.ends.reserve(static_cast<size_t>(piece_size_));
    for (int32_t id = 0; id < piece_size_; ++id) {
      int64_t size = -1;
      std::array<char, kErrorSize> error{};
      for (int attempt = 0; attempt < 2; ++attempt) {
        size = bridge_->piece_bytes(handle_, id, first ? 1 : 0, piece.data(), piece.size(),
                                    error.data(), error.size());
        if (size < 0 || static_cast<size_t>(size) <= piece.size()) break;
        piece.resize(static_cast<size_t>(size));
      }
      if (size < 0 || static_cast<size_t>(size) > piece.size()) {
        return absl::InvalidArgumentError(absl::StrCat("piece ", id, ": ", ErrorText(error)));
      }
      table.bytes.append(piece, 0, static_cast<size_t>(size));
      if (table.bytes.size() > UINT32_MAX) {
        return absl::InvalidArgumentError("the pieces' text exceeds 4 GiB");
      }
      table.ends.push_back(static_cast<uint32_t>(table.bytes.size()));
    }
  }
  return absl::OkStatus();
}

std::string_view SentencePieceModel::PieceTable::operator[](size_t i) const {
  const size_t start = i == 0 ? 0 : ends[i - 1];
  return std::string_view(bytes).substr(start, ends[i] - start);
}

std::string_view SentencePieceModel::PieceBytes(int32_t id, bool first) const {
  if (id < 0 || id >= piece_size_) return {};
  return (first ? first_ : after_text_)[static_cast<size_t>(id)];
}

absl::StatusOr<std::vector<int32_t>> SentencePieceModel::Encode(std::string_view text,
                                                                std::vector<size_t>* ends) const {
  // Usually one call: a piece covers at least one byte, plus a leading space
  // piece; normalization may expand text, and then a second call has room.
  std::vector<int32_t> ids(text.size() + 2);
  std::vector<uint64_t> span_ends(ends != nullptr ? ids.size() : 0);
  for (int attempt = 0; attempt < 2; ++attempt) {
    std::array<char, kErrorSize> error{};
    const int64_t count = bridge_->encode(handle_, text.data(), text.size(), ids.data(),
                                          ends != nullptr ? span_ends.data() : nullptr, ids.size(),
                                          error.data(), error.size());
    if (count < 0) return absl::InvalidArgumentError(ErrorText(error));
    const bool fits = static_cast<size_t>(count) <= ids.size();
    ids.resize(static_cast<size_t>(count));
    if (ends != nullptr) span_ends.resize(ids.size());
    if (fits) {
      if (ends != nullptr) ends->assign(span_ends.begin(), span_ends.end());
      return ids;
    }
  }
  return absl::InternalError("SentencePiece encode: the id count changed between calls");
}

std::string SentencePieceModel::Decode(absl::Span<const int32_t> ids) const {
  std::vector<int32_t> known;
  known.reserve(ids.size());
  for (int32_t id : ids) {
    if (id >= 0 && id < piece_size_) known.push_back(id);
  }
  std::string text(known.size() * 8 + 16, '\0');
  for (int attempt = 0; attempt < 2; ++attempt) {
    std::array<char, kErrorSize> error{};
    const int64_t size = bridge_->decode(handle_, known.data(), known.size(), text.data(),
                                         text.size(), error.data(), error.size());
    if (size < 0) return std::string();
    const bool fits = static_cast<size_t>(size) <= text.size();
    text.resize(static_cast<size_t>(size));
    if (fits) return text;
  }
  return std::string();
}

}  // namespace switchserve
