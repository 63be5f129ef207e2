// Stop-string matching in the incremental detokenizer. The input holds up to
// four stop strings (a length byte, then the string; only valid UTF-8 ones
// are used, as request validation requires) and then the generated ids (one
// byte each, byte-level tokenizer). min_tokens is the input's size mod 5 (a
// stop string counts only when it ends past the text of the first
// min_tokens ids). The released text never contains a stop string that ends
// past that text; when one completes, the released text followed by that
// stop string begins the sanitized decoding of the ids so far and ends past
// it, and otherwise the whole sanitized decoding is released.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/text/detokenizer.h"
#include "engine/text/tokenizer.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace switchserve;
  static const auto* const tokenizer = CreateByteTokenizer().release();
  size_t at = 0;
  std::vector<std::string> stops;
  while (stops.size() < 4 && at < size) {
    const size_t wanted = data[at] % 8;
    ++at;
    const size_t length = std::min<size_t>(wanted, size - at);
    if (length == 0) break;
    std::string stop(reinterpret_cast<const char*>(data + at), length);
    at += length;
    if (IsValidUtf8(stop)) stops.push_back(std::move(stop));  // as validation requires
  }
  const int min_tokens = static_cast<int>(size % 5);
  IncrementalDetokenizer detokenizer(tokenizer, stops, {}, min_tokens);
  const size_t ids_at = at;
  std::vector<int32_t> ids;
  std::string released;
  bool stopped = false;
  for (; at < size && !stopped; ++at) {
    ids.push_back(data[at]);
    released += detokenizer.Add(data[at], &stopped);
  }
  if (!stopped) released += detokenizer.Finish(&stopped);
  std::string decoded;
  AppendSanitizedUtf8(tokenizer->Decode(ids), /*final_chunk=*/true, &decoded);
  // Where the text of the first min_tokens ids ends (as the detokenizer had
  // it then: an unfinished character not yet in it); npos when there were
  // fewer ids, and no stop string counted.
  size_t boundary = std::string::npos;
  if (size - ids_at >= static_cast<size_t>(min_tokens)) {
    std::string first;
    const std::vector<int32_t> head(ids.begin(), ids.begin() + min_tokens);
    AppendSanitizedUtf8(tokenizer->Decode(head), /*final_chunk=*/false, &first);
    boundary = first.size();
  }
  for (const std::string& stop : stops) {
    for (size_t pos = released.find(stop); pos != std::string::npos;
         pos = released.find(stop, pos + 1)) {
      FUZZ_CHECK(pos + stop.size() <= boundary);
    }
  }
  if (stopped) {
    bool explained = false;
    for (const std::string& stop : stops) {
      explained = explained || (decoded.rfind(released + stop, 0) == 0 &&
                                released.size() + stop.size() > boundary);
    }
    FUZZ_CHECK(explained);
  } else {
    FUZZ_CHECK(released == decoded);
  }
  return 0;
}
