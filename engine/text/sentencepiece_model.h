// A SentencePiece model, internal to the engine: libsentencepiece reached
// through libswitchserve_sentencepiece.so, which is loaded once per process
// into a linker namespace of its own (sentencepiece_bridge.h says why).
#ifndef SWITCHSERVE_ENGINE_TEXT_SENTENCEPIECE_MODEL_H_
#define SWITCHSERVE_ENGINE_TEXT_SENTENCEPIECE_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace switchserve {

struct SentencePieceBridge;

// Immutable after Load; Encode/Decode are const and safe from many threads.
class SentencePieceModel {
 public:
  // INVALID_ARGUMENT with the library's reason for a file it cannot load;
  // FAILED_PRECONDITION when the bridge library cannot be loaded (the message
  // names where it was looked for).
  static absl::StatusOr<std::unique_ptr<SentencePieceModel>> Load(const std::string& path);
  ~SentencePieceModel();

  SentencePieceModel(const SentencePieceModel&) = delete;
  SentencePieceModel& operator=(const SentencePieceModel&) = delete;

  // With `ends`, also where each id's span of `text` ends (bytes).
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text,
                                              std::vector<size_t>* ends = nullptr) const;
  // Ids outside [0, PieceSize()) are skipped.
  std::string Decode(absl::Span<const int32_t> ids) const;
  // What piece `id` adds to a text, after other text or as its first
  // visible piece (switchserve_spm_piece_bytes); nothing for ids outside
  // [0, PieceSize()).
  std::string_view PieceBytes(int32_t id, bool first) const;
  int PieceSize() const { return piece_size_; }

 private:
  SentencePieceModel(const SentencePieceBridge* bridge, void* handle);
  // Fills the two tables of PieceBytes, one bridge call per piece and place.
  absl::Status LoadPieceBytes();

  // Every piece's bytes one after another; piece i's are [ends[i - 1], ends[i]).
  struct PieceTable {
    std::string bytes;
    std::vector<uint32_t> ends;
    std::string_view operator[](size_t i) const;
  };

  const SentencePieceBridge* bridge_;
  void* handle_;  // owned; lives in the bridge's namespace
  int piece_size_ = 0;
  PieceTable after_text_, first_;
};

// Where the bridge library was found, or why it could not be loaded
// (FAILED_PRECONDITION). Loads it on first use.
absl::StatusOr<std::string> SentencePieceBridgePath();

}  // namespace switchserve

#endif  // SWITCHSERVE_ENGINE_TEXT_SENTENCEPIECE_MODEL_H_
