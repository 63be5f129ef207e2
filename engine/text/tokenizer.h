// Tokenizers: byte-level (token id = byte value; ids >= 256 are special) and
// SentencePiece (tokenizer.model through libsentencepiece).
// Immutable after creation; safe to use from many threads.
#ifndef SWITCHSERVE_ENGINE_TEXT_TOKENIZER_H_
#define SWITCHSERVE_ENGINE_TEXT_TOKENIZER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace switchserve {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Text to ids, without BOS/EOS.
  virtual absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text) const = 0;
  // Encode, and where each id's span of `text` ends (bytes): ids[0..i]
  // encode text[0, ends[i]). A SentencePiece model counts the whitespace its
  // normalisation removes in a neighbouring piece's span (leading spaces in
  // the first piece's). Without `ends` it is Encode.
  virtual absl::StatusOr<std::vector<int32_t>> EncodeSpans(std::string_view text,
                                                           std::vector<size_t>* ends) const = 0;
  // Ids to text (bytes; may end inside a multi-byte UTF-8 character when the
  // ids do). Special ids decode to nothing.
  virtual std::string Decode(absl::Span<const int32_t> ids) const = 0;
  // The bytes `id` adds to a text: after other text, or as the text's first
  // visible piece (`first`), where Decode drops a SentencePiece piece's
  // leading space. Decoding ids one by one with this gives Decode's bytes,
  // except that bytes no character alone stay bytes (Decode makes a
  // SentencePiece byte piece that is no character U+FFFD). Special ids: nothing.
  virtual std::string_view PieceBytes(int32_t id, bool first = false) const = 0;
  virtual std::string_view kind() const = 0;  // "byte" or "sentencepiece"
  // Number of ids the tokenizer itself can produce (256 for bytes; the
  // SentencePiece piece count). The model's vocab_size may be larger.
  virtual int vocab_size() const = 0;
};

std::unique_ptr<Tokenizer> CreateByteTokenizer();
// Loads `model_path` (a SentencePiece model). NOT_FOUND / INVALID_ARGUMENT name
// the file.
absl::StatusOr<std::unique_ptr<Tokenizer>> LoadSentencePieceTokenizer(
    const std::string& model_path);

}  // namespace switchserve

#endif  // SWITCHSERVE_ENGINE_TEXT_TOKENIZER_H_
