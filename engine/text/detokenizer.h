// Turns a request's generated ids into text incrementally: releases only
// complete, valid UTF-8 (bytes that can never form a character become U+FFFD),
// holds back text that may be the start of a stop string, and reports when a
// stop string completes. The text released over a request's life is the same
// however the ids arrive, so streamed chunks concatenate to the unary text.
// Each id costs its own bytes (Tokenizer::PieceBytes), not a decode of all
// the ids so far, and the text is what the ids add after the prompt's: a
// SentencePiece piece keeps its leading space unless the prompt decodes to
// nothing.
//
// Thread-compatible; one per request, owned by the engine thread.
#ifndef SWITCHSERVE_ENGINE_TEXT_DETOKENIZER_H_
#define SWITCHSERVE_ENGINE_TEXT_DETOKENIZER_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/types/span.h"
#include "engine/text/tokenizer.h"

namespace switchserve {

// Appends the valid UTF-8 prefix of `bytes` to `out`, replacing with one
// U+FFFD each byte that cannot start a character and each start of a
// character that the next byte breaks (its maximal subpart, as Python's
// decoder does). Returns how many bytes were consumed: all of them, except a
// trailing incomplete character when `final_chunk` is false (it is replaced
// by one U+FFFD when true).
size_t AppendSanitizedUtf8(std::string_view bytes, bool final_chunk, std::string* out);

// How many of the characters AppendSanitizedUtf8 makes of `bytes` (not the
// final chunk) end within its first `boundary` bytes: a character the bytes
// after `boundary` complete is not one of them, a byte they show to start no
// character (a U+FFFD) is.
size_t CharactersEndedWithin(std::string_view bytes, size_t boundary);

// True when `text` is valid UTF-8 (no overlong forms or surrogates).
bool IsValidUtf8(std::string_view text);

// `ids` decoded as one text (Tokenizer::Decode), bytes that form no
// character U+FFFD as AppendSanitizedUtf8 makes them at the text's end: an
// echoed prompt, a detokenized list of ids.
std::string DecodedText(const Tokenizer& tokenizer, absl::Span<const int32_t> ids);

// Whether `prompt` decodes to some text: then the first generated
// SentencePiece piece keeps its leading space (Tokenizer::PieceBytes' first).
bool PromptSpellsText(const Tokenizer& tokenizer, absl::Span<const int32_t> prompt);

class IncrementalDetokenizer {
 public:
  // `tokenizer` must outlive this object; `prompt` is read here only. A stop
  // string counts only when it ends in text after that of the first
  // `min_tokens` ids (it may begin before). With `include_stop`, the text
  // ends after the stop string rather than before it.
  IncrementalDetokenizer(const Tokenizer* tokenizer, std::vector<std::string> stop_strings,
                         absl::Span<const int32_t> prompt = {}, int min_tokens = 0,
                         bool include_stop = false);

  // Adds one generated id; returns the text it releases. Sets `*stopped` when
  // a stop string completed: the text up to the stop string has then been
  // released and nothing more will be.
  std::string Add(int32_t token_id, bool* stopped);
  // Releases everything held back (generation ended without a stop string),
  // incomplete trailing bytes as U+FFFD. Should that replacement complete a
  // stop string, the text ends before it and `*stopped` (when given) is set.
  std::string Finish(bool* stopped = nullptr);
  // The index of the stop string that ended the text (the first in the text;
  // of two starting together, the first given), or -1 while none has.
  int stop_index() const { return stop_index_; }

 private:
  std::string Release(size_t end);
  // Where the text ends at the first stop string in the unreleased text
  // (before it, or after it with include_stop_), or npos; `*which` its index.
  size_t FindStop(int* which) const;

  const Tokenizer* tokenizer_;
  std::vector<std::string> stop_strings_;
  int to_min_tokens_;  // ids still to add before stops count
  bool include_stop_;
  size_t stops_after_ = std::string::npos;  // a stop string must end past this byte of text_
  bool text_started_ = false;               // some id (of the prompt too) added bytes
  std::string pending_;                     // bytes not yet in text_: an incomplete character
  std::string text_;                        // sanitized text of the bytes so far
  size_t released_ = 0;                     // bytes of text_ handed out
  bool stopped_ = false;
  int stop_index_ = -1;
};

}  // namespace switchserve

#endif  // SWITCHSERVE_ENGINE_TEXT_DETOKENIZER_H_
