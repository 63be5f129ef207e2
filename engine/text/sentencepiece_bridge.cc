// libswitchserve_sentencepiece.so: libsentencepiece behind a C interface
// (sentencepiece_bridge.h). Built without sanitizers and loaded into its own
// linker namespace; it includes no Abseil header (sentencepiece_processor.h
// declares an `absl::string_view` of its own).
#include "engine/text/sentencepiece_bridge.h"

#include <sentencepiece_processor.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

namespace {

using sentencepiece::SentencePieceProcessor;

void WriteError(std::string_view message, char* error, size_t error_size) {
  if (error == nullptr || error_size == 0) return;
  const size_t n = std::min(message.size(), error_size - 1);
  std::memcpy(error, message.data(), n);
  error[n] = '\0';
}

const SentencePieceProcessor& Processor(const void* handle) {
  return *static_cast<const SentencePieceProcessor*>(handle);
}

}  // namespace

#define SWITCHSERVE_SPM_EXPORT __attribute__((visibility("default")))

extern "C" {

SWITCHSERVE_SPM_EXPORT int switchserve_spm_bridge_version(void) {
  return SWITCHSERVE_SPM_BRIDGE_VERSION;
}

SWITCHSERVE_SPM_EXPORT void* switchserve_spm_load(const char* path, char* error,
                                                  size_t error_size) {
  try {
    auto* processor = new SentencePieceProcessor();
    const sentencepiece::util::Status status = processor->Load(path);
    if (!status.ok()) {
      WriteError(status.ToString(), error, error_size);
      delete processor;
      return nullptr;
    }
    return processor;
  } catch (const std::exception& e) {
    WriteError(e.what(), error, error_size);
    return nullptr;
  }
}

SWITCHSERVE_SPM_EXPORT void switchserve_spm_free(void* processor) {
  delete static_cast<SentencePieceProcessor*>(processor);
}

SWITCHSERVE_SPM_EXPORT int32_t switchserve_spm_piece_size(const void* processor) {
  return Processor(processor).GetPieceSize();
}

SWITCHSERVE_SPM_EXPORT int64_t switchserve_spm_encode(const void* processor, const char* text,
                                                      size_t text_size, int32_t* ids,
                                                      uint64_t* ends, size_t capacity, char* error,
                                                      size_t error_size) {
  try {
    const std::string_view input(text, text_size);
    if (ends == nullptr) {
      std::vector<int> pieces;
      const sentencepiece::util::Status status = Processor(processor).Encode(input, &pieces);
      if (!status.ok()) {
        WriteError(status.ToString(), error, error_size);
        return -1;
      }
      const size_t n = std::min(pieces.size(), capacity);
      for (size_t i = 0; i < n; ++i) ids[i] = pieces[i];
      return static_cast<int64_t>(pieces.size());
    }
    // The pieces with their spans of the input (begin and end in bytes).
    sentencepiece::ImmutableSentencePieceText spans;
    const sentencepiece::util::Status status =
        Processor(processor).Encode(input, spans.mutable_proto());
    if (!status.ok()) {
      WriteError(status.ToString(), error, error_size);
      return -1;
    }
    const size_t count = spans.pieces_size();
    const size_t n = std::min(count, capacity);
    for (size_t i = 0; i < n; ++i) {
      const auto piece = spans.pieces(static_cast<int>(i));
      ids[i] = static_cast<int32_t>(piece.id());
      ends[i] = piece.end();
    }
    return static_cast<int64_t>(count);
  } catch (const std::exception& e) {
    WriteError(e.what(), error, error_size);
    return -1;
  }
}

SWITCHSERVE_SPM_EXPORT int64_t switchserve_spm_decode(const void* processor, const int32_t* ids,
                                                      size_t count, char* text, size_t capacity,
                                                      char* error, size_t error_size) {
  try {
    const std::vector<int> pieces(ids, ids + count);
    std::string decoded;
    const sentencepiece::util::Status status = Processor(processor).Decode(pieces, &decoded);
    if (!status.ok()) {
      WriteError(status.ToString(), error, error_size);
      return -1;
    }
    if (capacity > 0) std::memcpy(text, decoded.data(), std::min(decoded.size(), capacity));
    return static_cast<int64_t>(decoded.size());
  } catch (const std::exception& e) {
    WriteError(e.what(), error, error_size);
    return -1;
  }
}

SWITCHSERVE_SPM_EXPORT int64_t switchserve_spm_piece_bytes(const void* processor, int32_t id,
                                                           int first, char* bytes, size_t capacity,
                                                           char* error, size_t error_size) {
  try {
    const SentencePieceProcessor& spm = Processor(processor);
    if (id < 0 || id >= spm.GetPieceSize()) {
      WriteError("piece id out of range", error, error_size);
      return -1;
    }
    std::string out;
    if (spm.IsByte(id)) {
      // "<0xAB>": Decode would make U+FFFD of a byte that is no character
      // alone; the caller joins bytes into characters itself.
      const std::string piece = spm.IdToPiece(id);
      out.push_back(static_cast<char>(std::stoi(piece.substr(3, 2), nullptr, 16)));
    } else if (first != 0 || spm.IsUnknown(id)) {
      const sentencepiece::util::Status status = spm.Decode(std::vector<int>{id}, &out);
      if (!status.ok()) {
        WriteError(status.ToString(), error, error_size);
        return -1;
      }
    } else if (!spm.IsControl(id)) {
      // After other text Decode keeps every U+2581 of a piece, as a space.
      constexpr std::string_view kSpaceSymbol = "\xE2\x96\x81";
      const std::string piece = spm.IdToPiece(id);
      for (size_t i = 0; i < piece.size();) {
        if (std::string_view(piece).substr(i, kSpaceSymbol.size()) == kSpaceSymbol) {
          out.push_back(' ');
          i += kSpaceSymbol.size();
        } else {
          out.push_back(piece[i++]);
        }
      }
    }
    if (capacity > 0) std::memcpy(bytes, out.data(), std::min(out.size(), capacity));
    return static_cast<int64_t>(out.size());
  } catch (const std::exception& e) {
    WriteError(e.what(), error, error_size);
    return -1;
  }
}

}  // extern "C"
