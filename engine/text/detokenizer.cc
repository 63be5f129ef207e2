#include "engine/text/detokenizer.h"

#include <algorithm>
#include <utility>

namespace switchserve {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD

enum class CharScan { kValid, kIncomplete, kInvalid };

// Scans the character starting at bytes[0]; on kValid sets `*length` to its
// bytes, on kInvalid to those of its maximal subpart (Unicode 3.9, "U+FFFD
// Substitution of Maximal Subparts", as Python's and browsers' decoders
// replace): the longest start of a character that the next byte breaks, or
// the one byte that starts none. One U+FFFD replaces them, whatever follows,
// as one replaces an unfinished character at the end of the text.
CharScan ScanChar(std::string_view bytes, size_t* length) {
  const auto b0 = static_cast<unsigned char>(bytes[0]);
  *length = 1;
  if (b0 < 0x80) return CharScan::kValid;
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;  // no overlong forms
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;  // <= U+10FFFF
  } else {
    return CharScan::kInvalid;
  }
  for (size_t i = 1; i < need; ++i) {
    if (i >= bytes.size()) return CharScan::kIncomplete;
    const auto b = static_cast<unsigned char>(bytes[i]);
    const unsigned char min = i == 1 ? lo : 0x80, max = i == 1 ? hi : 0xBF;
    if (b < min || b > max) {
      *length = i;
      return CharScan::kInvalid;
    }
  }
  *length = need;
  return CharScan::kValid;
}

}  // namespace

size_t AppendSanitizedUtf8(std::string_view bytes, bool final_chunk, std::string* out) {
  size_t i = 0;
  while (i < bytes.size()) {
    size_t length = 0;
    switch (ScanChar(bytes.substr(i), &length)) {
      case CharScan::kValid:
        out->append(bytes.substr(i, length));
        i += length;
        break;
      case CharScan::kInvalid:
        out->append(kReplacement);
        i += length;
        break;
      case CharScan::kIncomplete:
        if (!final_chunk) return i;
        out->append(kReplacement);
        return bytes.size();
    }
  }
  return i;
}

size_t CharactersEndedWithin(std::string_view bytes, size_t boundary) {
  size_t count = 0, i = 0;
  while (i < bytes.size()) {
    size_t length = 0;
    const CharScan scan = ScanChar(bytes.substr(i), &length);
    if (scan == CharScan::kIncomplete) break;
    i += length;
    if (i > boundary) break;
    ++count;
  }
  return count;
}

bool IsValidUtf8(std::string_view text) {
  size_t i = 0;
  while (i < text.size()) {
    size_t length = 0;
    if (ScanChar(text.substr(i), &length) != CharScan::kValid) return false;
    i += length;
  }
  return true;
}

std::string DecodedText(const Tokenizer& tokenizer, absl::Span<const int32_t> ids) {
  std::string text;
  AppendSanitizedUtf8(tokenizer.Decode(ids), /*final_chunk=*/true, &text);
  return text;
}

bool PromptSpellsText(const Tokenizer& tokenizer, absl::Span<const int32_t> prompt) {
  return std::any_of(prompt.begin(), prompt.end(), [&tokenizer](int32_t id) {
    return !tokenizer.PieceBytes(id, /*first=*/true).empty();
  });
}

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer* tokenizer,
                                               std::vector<std::string> stop_strings,
                                               absl::Span<const int32_t> prompt, int min_tokens,
                                               bool include_stop)
    : tokenizer_(tokenizer),
      stop_strings_(std::move(stop_strings)),
      to_min_tokens_(min_tokens),
      include_stop_(include_stop),
      text_started_(PromptSpellsText(*tokenizer, prompt)) {
  if (to_min_tokens_ <= 0) stops_after_ = 0;
}

std::string IncrementalDetokenizer::Add(int32_t token_id, bool* stopped) {
  *stopped = false;
  if (stopped_) return "";
  const std::string_view bytes = tokenizer_->PieceBytes(token_id, !text_started_);
  text_started_ = text_started_ || !bytes.empty();
  pending_.append(bytes);
  pending_.erase(0, AppendSanitizedUtf8(pending_, false, &text_));
  if (to_min_tokens_ > 0 && --to_min_tokens_ == 0) stops_after_ = text_.size();

  if (const size_t end = FindStop(&stop_index_); end != std::string::npos) {
    stopped_ = true;
    *stopped = true;
    return Release(end);
  }

  // Hold back the longest tail of text_ that is a proper prefix of a stop
  // string.
  size_t hold = 0;
  for (const std::string& stop : stop_strings_) {
    const size_t max_len = std::min(stop.size() - 1, text_.size() - released_);
    for (size_t len = max_len; len > hold; --len) {
      if (std::string_view(text_).substr(text_.size() - len) ==
          std::string_view(stop).substr(0, len)) {
        hold = len;
        break;
      }
    }
  }
  return Release(text_.size() - hold);
}

std::string IncrementalDetokenizer::Finish(bool* stopped) {
  if (stopped != nullptr) *stopped = false;
  if (stopped_) return "";
  AppendSanitizedUtf8(pending_, true, &text_);
  pending_.clear();
  // The last replacement character may complete a stop string.
  if (const size_t end = FindStop(&stop_index_); end != std::string::npos) {
    stopped_ = true;
    if (stopped != nullptr) *stopped = true;
    return Release(end);
  }
  return Release(text_.size());
}

size_t IncrementalDetokenizer::FindStop(int* which) const {
  // A stop string cannot start inside released text: any text that might
  // begin one is held back (Add).
  size_t stop_at = std::string::npos, end = std::string::npos;
  *which = -1;
  if (stops_after_ == std::string::npos) return stop_at;
  for (size_t i = 0; i < stop_strings_.size(); ++i) {
    const std::string& stop = stop_strings_[i];
    // Those starting here or later end past stops_after_.
    const size_t from = stops_after_ >= stop.size() ? stops_after_ + 1 - stop.size() : 0;
    const size_t pos = text_.find(stop, std::max(released_, from));
    if (pos < stop_at) {
      stop_at = pos;
      end = pos + stop.size();
      *which = static_cast<int>(i);
    }
  }
  return include_stop_ ? end : stop_at;
}

std::string IncrementalDetokenizer::Release(size_t end) {
  if (end <= released_) return "";
  std::string out = text_.substr(released_, end - released_);
  released_ = end;
  return out;
}

}  // namespace switchserve
