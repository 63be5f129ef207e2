// The tokenizers and the incremental detokenizer on arbitrary input. The
// first byte picks the tokenizer (byte-level or the test SentencePiece
// model); the rest is text to encode and, read as 16-bit ids, a generation
// to detokenize. Encoded ids lie in the vocabulary, with their spans' ends in
// order inside the text; the byte tokenizer round-trips any bytes; the
// detokenizer releases only valid UTF-8, and for the (prefix-stable) byte
// tokenizer exactly the sanitized decoding of all ids, however they arrive.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/text/detokenizer.h"
#include "engine/text/tokenizer.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

const switchserve::Tokenizer& SentencePiece() {
  static const switchserve::Tokenizer* const tokenizer = [] {
    auto loaded = switchserve::LoadSentencePieceTokenizer(SWITCHSERVE_SOURCE_DIR
                                                          "/tests/data/spm/tokenizer.model");
    FUZZ_CHECK(loaded.ok());
    return loaded->release();
  }();
  return *tokenizer;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace switchserve;
  if (size == 0) return 0;
  static const auto* const bytes = CreateByteTokenizer().release();
  const bool byte_level = data[0] % 2 == 0;
  const Tokenizer& tokenizer = byte_level ? *bytes : SentencePiece();
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);

  absl::StatusOr<std::vector<int32_t>> ids = tokenizer.Encode(text);
  if (byte_level) FUZZ_CHECK(ids.ok());
  if (ids.ok()) {
    for (int32_t id : *ids) FUZZ_CHECK(id >= 0 && id < tokenizer.vocab_size());
    if (byte_level) FUZZ_CHECK(tokenizer.Decode(*ids) == text);
    // The same ids with their spans: ends in order, inside the text.
    std::vector<size_t> ends;
    absl::StatusOr<std::vector<int32_t>> spanned = tokenizer.EncodeSpans(text, &ends);
    FUZZ_CHECK(spanned.ok() && *spanned == *ids && ends.size() == ids->size());
    for (size_t i = 0; i < ends.size(); ++i) {
      FUZZ_CHECK(ends[i] <= text.size() && (i == 0 || ends[i - 1] <= ends[i]));
    }
  }

  // The same bytes as a generation: ids past the vocabulary are special.
  std::vector<int32_t> generated;
  for (size_t i = 1; i + 1 < size; i += 2) {
    generated.push_back(static_cast<int32_t>(data[i] | (data[i + 1] << 8)) % 320);
  }
  IncrementalDetokenizer detokenizer(&tokenizer, {});
  std::string released;
  for (int32_t id : generated) {
    bool stopped = false;
    released += detokenizer.Add(id, &stopped);
    FUZZ_CHECK(!stopped);
  }
  released += detokenizer.Finish();
  FUZZ_CHECK(IsValidUtf8(released));
  if (byte_level) {
    std::string expected;
    AppendSanitizedUtf8(tokenizer.Decode(generated), /*final_chunk=*/true, &expected);
    FUZZ_CHECK(released == expected);
  }
  return 0;
}
