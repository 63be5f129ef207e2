#include "engine/text/detokenizer.h"

#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "engine/text/tokenizer.h"
#include "gtest/gtest.h"
#include "tests/util/fake_backend.h"
#include "tests/util/test_util.h"

namespace switchserve {
namespace {

// Feeds `bytes` one id per byte; returns the released chunks.
std::vector<std::string> Feed(const std::string& bytes, std::vector<std::string> stops,
                              bool* stopped_out = nullptr, int min_tokens = 0,
                              bool include_stop = false) {
  auto tokenizer = CreateByteTokenizer();
  IncrementalDetokenizer detok(tokenizer.get(), std::move(stops), {}, min_tokens, include_stop);
  std::vector<std::string> chunks;
  bool stopped = false;
  for (unsigned char c : bytes) {
    chunks.push_back(detok.Add(c, &stopped));
    if (stopped) break;
  }
  if (!stopped) chunks.push_back(detok.Finish());
  if (stopped_out) *stopped_out = stopped;
  return chunks;
}

std::string Join(const std::vector<std::string>& chunks) {
  std::string out;
  for (const auto& c : chunks) out += c;
  return out;
}

TEST(DetokenizerTest, NeverSplitsMultiByteCharacters) {
  const std::string text = "a\xC3\xA9z\xE2\x82\xAC\xF0\x9F\x98\x80";  // aéz€😀
  const auto chunks = Feed(text, {});
  for (const auto& chunk : chunks) EXPECT_TRUE(IsValidUtf8(chunk)) << chunk;
  EXPECT_EQ(Join(chunks), text);
  EXPECT_EQ(chunks[1], "");  // first byte of é held back
  EXPECT_EQ(chunks[2], "\xC3\xA9");
}

TEST(DetokenizerTest, InvalidBytesBecomeReplacementCharacter) {
  EXPECT_EQ(Join(Feed("a\xFF"
                      "b",
                      {})),
            "a\xEF\xBF\xBD"
            "b");
  EXPECT_EQ(Join(Feed("a\xE2\x82", {})), "a\xEF\xBF\xBD");  // truncated at the end
  EXPECT_EQ(Join(Feed("\xED\xA0\x80", {})), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate
}

// Overlong forms and code points past U+10FFFF are not UTF-8: their first
// byte starts no character that the second continues, so each byte is one
// U+FFFD, as for surrogates.
TEST(DetokenizerTest, OverlongAndOutOfRangeFormsBecomeReplacementCharacters) {
  const std::string fffd = "\xEF\xBF\xBD";
  EXPECT_EQ(Join(Feed("\xC0\x80", {})), fffd + fffd);                        // U+0000 in two bytes
  EXPECT_EQ(Join(Feed("\xE0\x80\x80", {})), fffd + fffd + fffd);             // in three
  EXPECT_EQ(Join(Feed("\xF0\x80\x80\x80", {})), fffd + fffd + fffd + fffd);  // in four
  EXPECT_EQ(Join(Feed("\xF4\x90\x80\x80", {})), fffd + fffd + fffd + fffd);  // U+110000
  EXPECT_EQ(Join(Feed("\xE0\xA0\x80", {})), "\xE0\xA0\x80");  // U+0800, the first in three
}

// A character's start that the next byte breaks is one U+FFFD, as an
// unfinished character at the end is (Unicode's maximal subparts, Python's
// decode(errors="replace")): the same bytes give the same text whether or
// not generation stops after them. They gave one U+FFFD per byte before a
// byte that broke them, one in all at the end.
TEST(DetokenizerTest, ABrokenCharacterIsOneReplacementWhateverFollows) {
  const std::string fffd = "\xEF\xBF\xBD";
  EXPECT_EQ(Join(Feed("\xE0\xB9", {})), fffd);
  EXPECT_EQ(Join(Feed("\xE0\xB9"
                      "A",
                      {})),
            fffd + "A");
  EXPECT_EQ(Join(Feed("\xF0\x90\x80"
                      "A",
                      {})),
            fffd + "A");
  EXPECT_EQ(Join(Feed("\xF0\x90\x80\xC3\xA9", {})), fffd + "\xC3\xA9");
  EXPECT_EQ(Join(Feed("\xEC\xB9\x1A\xEC\xB9", {})), fffd + "\x1A" + fffd);
  // A byte that starts no character is one each.
  EXPECT_EQ(Join(Feed("\x80\xBF\xF5", {})), fffd + fffd + fffd);
}

TEST(DetokenizerTest, StopStringEndsTextBeforeIt) {
  bool stopped = false;
  const auto chunks = Feed("hello world, bye", {"wor", "xyz"}, &stopped);
  EXPECT_TRUE(stopped);
  EXPECT_EQ(Join(chunks), "hello ");
}

// include_stop_str_in_output: the text ends after the stop string, the
// earliest one; nothing after it is released.
TEST(DetokenizerTest, AnIncludedStopStringEndsTheText) {
  bool stopped = false;
  EXPECT_EQ(Join(Feed("hello world, bye", {"wor", "xyz"}, &stopped, 0, true)), "hello wor");
  EXPECT_TRUE(stopped);
  EXPECT_EQ(Join(Feed("xxabc", {"bc", "ab"}, &stopped, 0, true)), "xxab");
  EXPECT_EQ(Join(Feed("ab.ab.ab", {"b."}, &stopped, 3, true)), "ab.ab.");
  EXPECT_EQ(Join(Feed("no stop here", {"xyz"}, &stopped, 0, true)), "no stop here");
  EXPECT_FALSE(stopped);
}

// Of several stop strings the text holds, the earliest ends it, whatever
// their order in the request.
TEST(DetokenizerTest, TheEarliestStopStringEndsTheText) {
  for (const std::vector<std::string>& stops :
       {std::vector<std::string>{"ab", "b"}, std::vector<std::string>{"b", "ab"}}) {
    bool stopped = false;
    EXPECT_EQ(Join(Feed("xxab", stops, &stopped)), "xx") << stops[0];
    EXPECT_TRUE(stopped);
  }
}

// stop_index names the stop string that ended the text: the earliest in
// the text, of two starting together the first given; -1 until one does.
TEST(DetokenizerTest, StopIndexNamesTheStopStringThatEndedTheText) {
  auto tokenizer = CreateByteTokenizer();
  auto stop_index = [&](const std::string& text, const std::vector<std::string>& stops) {
    IncrementalDetokenizer detok(tokenizer.get(), stops);
    bool stopped = false;
    for (unsigned char byte : text) {
      EXPECT_EQ(detok.stop_index(), -1);
      detok.Add(byte, &stopped);
      if (stopped) break;
    }
    if (!stopped) detok.Finish(&stopped);
    return detok.stop_index();
  };
  EXPECT_EQ(stop_index("xxab", {"ab", "b"}), 0);
  EXPECT_EQ(stop_index("xxab", {"b", "ab"}), 1);
  EXPECT_EQ(stop_index("xxabc", {"abc", "ab"}), 1);  // "ab" completes first
  EXPECT_EQ(stop_index("hello world", {"xyz", "wor"}), 1);
  EXPECT_EQ(stop_index("hello world", {"xyz"}), -1);
}

// With min_tokens, a stop string counts only when it ends in the text of a
// later id: one that lies in the first ids' text stays in the text, one that
// begins there and ends later stops it.
TEST(DetokenizerTest, StopStringsCountOnlyWhenTheyEndPastMinTokens) {
  bool stopped = false;
  // The first "b." ends with the third id: counted past two, not past three.
  EXPECT_EQ(Join(Feed("ab.ab.ab", {"b."}, &stopped, 0)), "a");
  EXPECT_TRUE(stopped);
  EXPECT_EQ(Join(Feed("ab.ab.ab", {"b."}, &stopped, 2)), "a");
  EXPECT_TRUE(stopped);
  EXPECT_EQ(Join(Feed("ab.ab.ab", {"b."}, &stopped, 3)), "ab.a");
  EXPECT_TRUE(stopped);
  EXPECT_EQ(Join(Feed("ab.ab.ab", {"b.", "ab"}, &stopped, 7)), "ab.ab.");
  EXPECT_TRUE(stopped);  // "ab" ends at the eighth id
  EXPECT_EQ(Join(Feed("ab.ab.ab", {"b."}, &stopped, 8)), "ab.ab.ab");
  EXPECT_FALSE(stopped);
}

// The same rule on random texts of three letters, against its plain
// statement: the text stops at the first id after which a stop string ends
// with that id's byte past the first min_tokens bytes, before the longest
// stop string ending there.
TEST(DetokenizerTest, MinTokensStopsWhereThePlainRuleSays) {
  std::mt19937 rng(17);
  const std::string letters = "ab.";
  auto random_text = [&](int length) {
    std::string text;
    for (int i = 0; i < length; ++i) text += letters[rng() % letters.size()];
    return text;
  };
  for (int trial = 0; trial < 3000; ++trial) {
    const std::string text = random_text(12);
    std::vector<std::string> stops;
    for (int i = 1 + static_cast<int>(rng() % 3); i > 0; --i) {
      stops.push_back(random_text(1 + static_cast<int>(rng() % 3)));
    }
    const int min_tokens = static_cast<int>(rng() % 14);
    std::string want = text;
    bool want_stopped = false;
    for (size_t end = static_cast<size_t>(min_tokens) + 1; end <= text.size() && !want_stopped;
         ++end) {
      for (const std::string& stop : stops) {
        if (stop.size() <= end && text.compare(end - stop.size(), stop.size(), stop) == 0 &&
            (!want_stopped || end - stop.size() < want.size())) {
          want = text.substr(0, end - stop.size());
          want_stopped = true;
        }
      }
    }
    bool stopped = false;
    EXPECT_EQ(Join(Feed(text, stops, &stopped, min_tokens)), want)
        << text << " min_tokens " << min_tokens << " stops " << absl::StrJoin(stops, ",");
    EXPECT_EQ(stopped, want_stopped) << text;
  }
}

TEST(DetokenizerTest, HoldsBackPossibleStopPrefixThenReleasesIt) {
  const auto chunks = Feed("abcab", {"abd"});
  EXPECT_EQ(chunks[0], "");  // "a" may start "abd"
  EXPECT_EQ(chunks[1], "");  // "ab" too
  EXPECT_EQ(chunks[2], "abc");
  EXPECT_EQ(Join(chunks), "abcab");
}

TEST(DetokenizerTest, UtilityFunctions) {
  EXPECT_TRUE(IsValidUtf8("plain \xE2\x82\xAC"));
  EXPECT_FALSE(IsValidUtf8("\xC0\xAF"));          // overlong
  EXPECT_FALSE(IsValidUtf8("\xF4\x90\x80\x80"));  // > U+10FFFF
  std::string out;
  EXPECT_EQ(AppendSanitizedUtf8("ab\xE2\x82", false, &out), 2u);
  EXPECT_EQ(out, "ab");
}

// Found by fuzzing (stop_strings_fuzz): a stop string completed by the
// replacement character that Finish gives a truncated last character used to
// be released.
TEST(DetokenizerTest, StopStringCompletedAtTheEndIsNotReleased) {
  auto tokenizer = CreateByteTokenizer();
  const std::string replacement = "\xEF\xBF\xBD";
  IncrementalDetokenizer detok(tokenizer.get(), {"c" + replacement});
  std::string released;
  bool stopped = false;
  for (unsigned char byte : std::string("abc\xE2\x82")) released += detok.Add(byte, &stopped);
  EXPECT_FALSE(stopped);
  released += detok.Finish(&stopped);
  EXPECT_TRUE(stopped);
  EXPECT_EQ(released, "ab");
  EXPECT_EQ(detok.Finish(), "");
}

// The text a SentencePiece generation releases is what its ids add to the
// prompt's text: a piece after the prompt keeps its leading space.
TEST(DetokenizerTest, GeneratedPiecesContinueThePromptsText) {
  for (const char* model : {"tokenizer.model", "byte_fallback.model"}) {
    auto tokenizer =
        LoadSentencePieceTokenizer(testing::SourcePath(std::string("tests/data/spm/") + model));
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    const std::string text = "The river runs past the old mill mill, and the baker opens the shop.";
    const std::vector<int32_t> ids = *(*tokenizer)->Encode(text);
    for (size_t split = 1; split < ids.size(); ++split) {
      const std::vector<int32_t> prompt(ids.begin(), ids.begin() + split);
      IncrementalDetokenizer detok(tokenizer->get(), {}, prompt);
      std::string released;
      bool stopped = false;
      for (size_t i = split; i < ids.size(); ++i) released += detok.Add(ids[i], &stopped);
      released += detok.Finish();
      EXPECT_EQ((*tokenizer)->Decode(prompt) + released, text) << model << ", split " << split;
    }
  }
}

// A prompt that decodes to nothing (a control piece alone): the first
// generated piece is the text's first, without its leading space, as
// Decode gives it.
TEST(DetokenizerTest, APromptWithoutTextDropsTheFirstPiecesSpace) {
  auto tokenizer =
      LoadSentencePieceTokenizer(testing::SourcePath("tests/data/spm/tokenizer.model"));
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const std::vector<int32_t> ids = *(*tokenizer)->Encode("the old mill");
  const std::vector<int32_t> bos = {1};
  IncrementalDetokenizer detok(tokenizer->get(), {}, bos);
  std::string released;
  bool stopped = false;
  for (int32_t id : ids) released += detok.Add(id, &stopped);
  EXPECT_EQ(released + detok.Finish(), "the old mill");
}

// Byte pieces that spell one character, generated one by one, release the
// character once it is whole (not a U+FFFD per byte), and a stop string
// made of it stops the generation.
TEST(DetokenizerTest, BytePiecesJoinIntoTheirCharacter) {
  auto tokenizer =
      LoadSentencePieceTokenizer(testing::SourcePath("tests/data/spm/byte_fallback.model"));
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const std::vector<int32_t> prompt = *(*tokenizer)->Encode("The price:");
  const std::vector<int32_t> ids = *(*tokenizer)
                                        ->Encode(
                                            "The price: \xe2\x82\xac"
                                            "5 and \xe2\x82\xac"
                                            "6");
  std::vector<std::string> chunks;
  IncrementalDetokenizer detok(tokenizer->get(),
                               {"\xe2\x82\xac"
                                "6"},
                               prompt);
  bool stopped = false;
  for (size_t i = prompt.size(); i < ids.size() && !stopped; ++i) {
    chunks.push_back(detok.Add(ids[i], &stopped));
    EXPECT_TRUE(IsValidUtf8(chunks.back()));
  }
  EXPECT_TRUE(stopped);
  EXPECT_EQ(Join(chunks),
            " \xe2\x82\xac"
            "5 and ");
}

}  // namespace
}  // namespace switchserve
