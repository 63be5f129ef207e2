// The completions API's `logprobs` object (LogprobsObject in
// server/http/openai_protocol.h) for tokens whose bytes are anything: a
// vocabulary of arbitrary byte strings (broken UTF-8 included), or the byte
// tokenizer, or the SentencePiece test model with byte-fallback pieces.
// The tokens go in one call (a unary response) and in calls of a few tokens
// (a stream's events); the text ends open, after the last token or before it
// (an EOS). Checked: the object renders as JSON under nlohmann's strict UTF-8
// check, and that text is valid UTF-8 and parses back to the same object;
// every token's name gives back its bytes (or its id); each `top_logprobs`
// object holds the first of the alternatives that share a name, with its
// log-probability; `text_offset` never decreases and, counted over the whole
// text: a token that spells something starts at the characters the bytes
// before it end, one that spells nothing where the next that spells
// something starts in its call, or where the text has come to after the
// call; the events' objects put together are the unary one but for those
// offsets, and both leave the same characters and unfinished bytes behind.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "engine/runtime/request.h"
#include "engine/text/detokenizer.h"
#include "engine/text/tokenizer.h"
#include "nlohmann/json.hpp"
#include "server/http/openai_protocol.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

using namespace switchserve;
using OrderedJson = nlohmann::ordered_json;

// Pieces given by the input; ids past them are special (they spell nothing).
// As a SentencePiece piece does, a piece that starts with a space drops it
// as the text's first.
class PieceTokenizer : public Tokenizer {
 public:
  explicit PieceTokenizer(std::vector<std::string> pieces) : pieces_(std::move(pieces)) {}
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view) const override {
    return std::vector<int32_t>();
  }
  absl::StatusOr<std::vector<int32_t>> EncodeSpans(std::string_view,
                                                   std::vector<size_t>* ends) const override {
    if (ends != nullptr) ends->clear();
    return std::vector<int32_t>();
  }
  std::string Decode(absl::Span<const int32_t> ids) const override {
    std::string text;
    for (const int32_t id : ids) text.append(PieceBytes(id, false));
    return text;
  }
  std::string_view PieceBytes(int32_t id, bool first) const override {
    if (id < 0 || id >= vocab_size()) return {};
    std::string_view piece = pieces_[static_cast<size_t>(id)];
    if (first && !piece.empty() && piece[0] == ' ') piece.remove_prefix(1);
    return piece;
  }
  std::string_view kind() const override { return "pieces"; }
  int vocab_size() const override { return static_cast<int>(pieces_.size()); }

 private:
  std::vector<std::string> pieces_;
};

class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  bool empty() const { return at_ >= size_; }
  uint8_t Byte() { return at_ < size_ ? data_[at_++] : 0; }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t at_ = 0;
};

int64_t CharacterCount(std::string_view text) {
  int64_t n = 0;
  for (const char c : text) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

// Characters of the sanitized `bytes`, an unfinished last one as one U+FFFD
// when `final`.
int64_t Characters(std::string_view bytes, bool final) {
  std::string text;
  AppendSanitizedUtf8(bytes, final, &text);
  return CharacterCount(text);
}

// The `text_offset`s of `tokens` given in calls that end at `call_ends`, the
// last call's text ending as `end`: counted over the whole text.
std::vector<int64_t> ExpectedOffsets(const Tokenizer& tokenizer,
                                     const std::vector<GeneratedTokenInfo>& tokens,
                                     const std::vector<size_t>& call_ends, TextEnd end) {
  std::vector<int64_t> offsets(tokens.size());
  std::string bytes;
  size_t from = 0, unplaced = 0;
  for (const size_t call_end : call_ends) {
    const bool last_call = call_end == tokens.size();
    for (size_t i = from; i < call_end; ++i) {
      const bool in_text = !(last_call && end == TextEnd::kBeforeLast && i + 1 == tokens.size());
      const std::string_view piece =
          in_text ? tokenizer.PieceBytes(tokens[i].token_id, bytes.empty()) : "";
      if (piece.empty()) continue;
      const size_t before = bytes.size();
      bytes.append(piece);
      const int64_t start = static_cast<int64_t>(CharactersEndedWithin(bytes, before));
      for (size_t j = unplaced; j <= i; ++j) offsets[j] = start;
      unplaced = i + 1;
    }
    const int64_t so_far = Characters(bytes, last_call && end != TextEnd::kOpen);
    for (size_t j = unplaced; j < call_end; ++j) offsets[j] = so_far;
    unplaced = from = call_end;
  }
  return offsets;
}

float Logprob(uint8_t b) {
  if (b == 255) return -INFINITY;
  if (b == 254) return NAN;
  return -static_cast<float>(b) / 8.0f;
}

// A log-probability as the JSON has it: the number, or null when not finite.
bool SameLogprob(const OrderedJson& json, float logprob) {
  if (!std::isfinite(logprob)) return json.is_null();
  return json.is_number() && json.get<double>() == static_cast<double>(logprob);
}

// The bytes a token's name stands for: the name, or "bytes:\xNN..." decoded.
bool NameGivesBytes(const std::string& name, std::string_view bytes) {
  if (name == bytes) return true;
  if (name.rfind("bytes:", 0) != 0 || IsValidUtf8(bytes)) return false;
  std::string decoded;
  for (size_t i = 6; i < name.size(); i += 4) {
    int value = 0;
    if (name.compare(i, 2, "\\x") != 0 || i + 4 > name.size() ||
        !absl::SimpleHexAtoi(name.substr(i + 2, 2), &value)) {
      return false;
    }
    decoded.push_back(static_cast<char>(value));
  }
  return decoded == bytes;
}

const Tokenizer& SentencePieceTestModel() {
  static const Tokenizer* const tokenizer =
      LoadSentencePieceTokenizer(SWITCHSERVE_SOURCE_DIR "/tests/data/spm/byte_fallback.model")
          ->release();
  return *tokenizer;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Tokenizer* const byte_tokenizer = CreateByteTokenizer().release();
  Reader in(data, size);
  const int top_n = in.Byte() % 21;  // the API's range
  const uint8_t flags = in.Byte();
  const bool as_ids = flags & 1;
  static constexpr TextEnd kEnds[] = {TextEnd::kOpen, TextEnd::kAfterLast, TextEnd::kBeforeLast};
  const TextEnd end = kEnds[(flags >> 3) % 3];
  std::unique_ptr<PieceTokenizer> pieces;
  const Tokenizer* tokenizer = byte_tokenizer;
  if (flags & 2) {
    tokenizer = &SentencePieceTestModel();
  } else if (flags & 4) {
    std::vector<std::string> vocabulary(in.Byte() % 16 + 1);
    for (std::string& piece : vocabulary) {
      for (size_t n = in.Byte() % 9; n > 0; --n) piece.push_back(static_cast<char>(in.Byte()));
    }
    pieces = std::make_unique<PieceTokenizer>(std::move(vocabulary));
    tokenizer = pieces.get();
  }
  // Ids a little past the vocabulary too: special, they spell nothing.
  auto next_id = [&] {
    const int low = in.Byte();
    const int id = low | (in.Byte() << 8);
    return static_cast<int32_t>(id % (tokenizer->vocab_size() + 4));
  };

  // The tokens, and where the stream's events end.
  std::vector<GeneratedTokenInfo> tokens;
  std::vector<size_t> event_ends;
  while (!in.empty() && tokens.size() < 64) {
    GeneratedTokenInfo token;
    token.token_id = next_id();
    token.logprob = Logprob(in.Byte());
    const uint8_t shape = in.Byte();
    for (int i = shape % 6; i > 0; --i) {
      const int32_t id = next_id();
      token.top_logprobs.emplace_back(id, Logprob(in.Byte()));
    }
    tokens.push_back(std::move(token));
    if (shape & 0x80) event_ends.push_back(tokens.size());
  }
  event_ends.push_back(tokens.size());

  // Unary: every token at once. Streamed: one call an event, the offset
  // carried from one to the next, the text open until the last.
  TextOffset whole_offset;
  const OrderedJson whole = LogprobsObject(*tokenizer, tokens, top_n, as_ids, &whole_offset, end);
  TextOffset offset;
  OrderedJson joined = {{"tokens", OrderedJson::array()},
                        {"token_logprobs", OrderedJson::array()},
                        {"top_logprobs", OrderedJson::array()},
                        {"text_offset", OrderedJson::array()}};
  std::vector<size_t> call_ends;
  size_t from = 0;
  for (const size_t event_end : event_ends) {
    if (event_end == from && !(event_end == tokens.size() && call_ends.empty())) continue;
    const std::vector<GeneratedTokenInfo> event(tokens.begin() + static_cast<ptrdiff_t>(from),
                                                tokens.begin() + static_cast<ptrdiff_t>(event_end));
    const OrderedJson part = LogprobsObject(*tokenizer, event, top_n, as_ids, &offset,
                                            event_end == tokens.size() ? end : TextEnd::kOpen);
    for (auto& [key, values] : joined.items()) {
      FUZZ_CHECK(part.at(key).size() == event.size());
      for (const auto& value : part.at(key)) values.push_back(value);
    }
    call_ends.push_back(event_end);
    from = event_end;
  }

  // Renders under the strict UTF-8 check (it throws on invalid UTF-8), as
  // valid UTF-8, and parses back to the same object.
  std::string text;
  try {
    text = whole.dump();
  } catch (const nlohmann::json::type_error& error) {
    std::fprintf(stderr, "dump: %s\n", error.what());
    FUZZ_CHECK(false);
  }
  FUZZ_CHECK(IsValidUtf8(text));
  const OrderedJson parsed = OrderedJson::parse(text, nullptr, /*allow_exceptions=*/false);
  FUZZ_CHECK(!parsed.is_discarded());
  FUZZ_CHECK(parsed.dump() == text);
  for (const char* key : {"tokens", "token_logprobs", "top_logprobs"}) {
    FUZZ_CHECK(joined[key].dump() == whole[key].dump());
  }

  // Each token's name, log-probability and alternatives, as a client reads
  // them.
  FUZZ_CHECK(parsed.at("tokens").size() == tokens.size());
  auto name_of = [&](int32_t id, const std::string& name) {
    if (as_ids) return name == absl::StrCat("token_id:", id);
    return NameGivesBytes(name, tokenizer->PieceBytes(id));
  };
  for (size_t i = 0; i < tokens.size(); ++i) {
    const GeneratedTokenInfo& token = tokens[i];
    FUZZ_CHECK(name_of(token.token_id, parsed["tokens"][i].get<std::string>()));
    FUZZ_CHECK(SameLogprob(parsed["token_logprobs"][i], token.logprob));
    const OrderedJson& top = parsed["top_logprobs"][i];
    FUZZ_CHECK(top.is_object());
    std::vector<std::string> names;
    for (size_t a = 0; a < token.top_logprobs.size() && static_cast<int>(a) < top_n; ++a) {
      const auto& [id, logprob] = token.top_logprobs[a];
      const std::string name = TokenString(*tokenizer, id, as_ids);
      FUZZ_CHECK(name_of(id, name));
      FUZZ_CHECK(top.contains(name));
      if (std::find(names.begin(), names.end(), name) == names.end()) {
        FUZZ_CHECK(SameLogprob(top[name], logprob));  // the first (most likely) of that name
        names.push_back(name);
      }
    }
    // One key a name, most likely first.
    std::vector<std::string> keys;
    for (const auto& [key, value] : top.items()) keys.push_back(key);
    FUZZ_CHECK(keys == names);
  }

  // Offsets, counted over the whole text, unary and streamed; what both
  // leave behind.
  const std::vector<int64_t> unary = ExpectedOffsets(*tokenizer, tokens, {tokens.size()}, end);
  const std::vector<int64_t> streamed = ExpectedOffsets(*tokenizer, tokens, call_ends, end);
  int64_t previous = 0;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int64_t at = parsed["text_offset"][i].get<int64_t>();
    FUZZ_CHECK(at >= previous);
    previous = at;
    FUZZ_CHECK(at == unary[i]);
    FUZZ_CHECK(joined["text_offset"][i].get<int64_t>() == streamed[i]);
  }
  std::string bytes;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (end == TextEnd::kBeforeLast && i + 1 == tokens.size()) break;
    bytes.append(tokenizer->PieceBytes(tokens[i].token_id, bytes.empty()));
  }
  std::string sanitized;
  const size_t consumed = AppendSanitizedUtf8(bytes, end != TextEnd::kOpen, &sanitized);
  FUZZ_CHECK(whole_offset.characters == CharacterCount(sanitized));
  FUZZ_CHECK(whole_offset.pending == bytes.substr(consumed));
  FUZZ_CHECK(offset.characters == whole_offset.characters);
  FUZZ_CHECK(offset.pending == whole_offset.pending);
  return 0;
}
