#include "engine/text/tokenizer.h"

#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/util/test_util.h"

namespace switchserve {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string SpmModelPath() { return testing::SourcePath("tests/data/spm/tokenizer.model"); }
std::string ByteFallbackModelPath() {
  return testing::SourcePath("tests/data/spm/byte_fallback.model");
}

// The ids' bytes one by one, the first visible piece as a text's first.
std::string JoinPieceBytes(const Tokenizer& tokenizer, const std::vector<int32_t>& ids) {
  std::string text;
  for (int32_t id : ids) text.append(tokenizer.PieceBytes(id, /*first=*/text.empty()));
  return text;
}

TEST(ByteTokenizerTest, IdsAreBytes) {
  auto tokenizer = CreateByteTokenizer();
  EXPECT_EQ(tokenizer->kind(), "byte");
  EXPECT_EQ(tokenizer->vocab_size(), 256);
  EXPECT_THAT(*tokenizer->Encode("Hi!"), ElementsAre(72, 105, 33));
  EXPECT_TRUE(tokenizer->Encode("")->empty());
  // "é" is two bytes in UTF-8, "€" three, "𝄞" four; ids are the raw bytes.
  EXPECT_THAT(*tokenizer->Encode("\xc3\xa9"), ElementsAre(0xc3, 0xa9));
}

TEST(ByteTokenizerTest, RoundTripsAnyBytes) {
  auto tokenizer = CreateByteTokenizer();
  const std::string texts[] = {"plain ascii", "caf\xc3\xa9 \xe2\x82\xac 5 \xf0\x9d\x84\x9e",
                               std::string("nul\0inside\xff\x80", 12)};
  for (const std::string& text : texts) {
    auto ids = tokenizer->Encode(text);
    ASSERT_TRUE(ids.ok());
    EXPECT_EQ(ids->size(), text.size());
    EXPECT_EQ(tokenizer->Decode(*ids), text);
  }
}

TEST(ByteTokenizerTest, EachByteIsItsOwnSpan) {
  auto tokenizer = CreateByteTokenizer();
  std::vector<size_t> ends = {7};  // replaced, not appended to
  EXPECT_THAT(*tokenizer->EncodeSpans("Hi!", &ends), ElementsAre(72, 105, 33));
  EXPECT_THAT(ends, ElementsAre(1, 2, 3));
}

TEST(ByteTokenizerTest, SpecialIdsDecodeToNothing) {
  auto tokenizer = CreateByteTokenizer();
  EXPECT_EQ(tokenizer->Decode({256, 72, 300, 105, -1, 1 << 30}), "Hi");
  // Decoding part of a multi-byte character gives the partial bytes.
  EXPECT_EQ(tokenizer->Decode({0xe2, 0x82}), "\xe2\x82");
}

TEST(SentencePieceTokenizerTest, EncodesAndDecodes) {
  auto tokenizer = LoadSentencePieceTokenizer(SpmModelPath());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  EXPECT_EQ((*tokenizer)->kind(), "sentencepiece");
  EXPECT_EQ((*tokenizer)->vocab_size(), 300);
  const std::string text = "The river runs past the old mill, and the baker opens the shop.";
  auto ids = (*tokenizer)->Encode(text);
  ASSERT_TRUE(ids.ok()) << ids.status();
  // Subword pieces: fewer ids than bytes, every id inside the vocabulary.
  EXPECT_LT(ids->size(), text.size() / 2);
  for (int32_t id : *ids) {
    EXPECT_GE(id, 0);
    EXPECT_LT(id, 300);
  }
  EXPECT_EQ((*tokenizer)->Decode(*ids), text);
  EXPECT_EQ(*(*tokenizer)->Encode(text), *ids);  // deterministic
}

// A piece's span also covers the whitespace normalisation removed before it:
// the leading spaces belong to the first piece, the second space between two
// words to the piece after it.
TEST(SentencePieceTokenizerTest, SpansCoverTheWhitespaceNormalisationRemoves) {
  auto tokenizer = LoadSentencePieceTokenizer(SpmModelPath());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const std::string text = "   The river  runs";
  std::vector<size_t> ends = {7};  // replaced, not appended to
  auto ids = (*tokenizer)->EncodeSpans(text, &ends);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(*ids, *(*tokenizer)->Encode(text));
  EXPECT_EQ(*ids, *(*tokenizer)->Encode("The river runs"));
  // "▁T he ▁river ▁r un s"
  EXPECT_THAT(ends, ElementsAre(4, 6, 12, 15, 17, 18));  // "▁r": both spaces and "r"
}

TEST(SentencePieceTokenizerTest, UnknownAndSpecialIds) {
  auto tokenizer = LoadSentencePieceTokenizer(SpmModelPath());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  auto ids = (*tokenizer)->Encode("the river");
  ASSERT_TRUE(ids.ok());
  std::vector<int32_t> with_specials = {1};  // bos (a control piece)
  for (int32_t id : *ids) {
    with_specials.push_back(id);
    with_specials.push_back(5000);  // beyond the model's pieces
  }
  with_specials.push_back(-3);
  with_specials.push_back(2);  // eos
  EXPECT_EQ((*tokenizer)->Decode(with_specials), "the river");
  EXPECT_TRUE((*tokenizer)->Encode("")->empty());
  // A character the model never saw maps to the unknown id (0) rather than failing.
  auto unknown = (*tokenizer)->Encode("\xe6\x97\xa5");
  ASSERT_TRUE(unknown.ok());
  EXPECT_THAT(*unknown, ::testing::Contains(0));
}

TEST(ByteTokenizerTest, PieceBytesAreTheByte) {
  auto tokenizer = CreateByteTokenizer();
  for (int32_t id = 0; id < 256; ++id) {
    EXPECT_EQ(tokenizer->PieceBytes(id), std::string(1, static_cast<char>(id)));
    EXPECT_EQ(tokenizer->PieceBytes(id, /*first=*/true), std::string(1, static_cast<char>(id)));
  }
  EXPECT_EQ(tokenizer->PieceBytes(256), "");
  EXPECT_EQ(tokenizer->PieceBytes(-1), "");
}

// Pieces decoded one by one give what decoding them together gives, and a
// piece after text keeps the space Decode drops from a text's first piece.
TEST(SentencePieceTokenizerTest, PieceBytesJoinToWhatDecodeGives) {
  auto tokenizer = LoadSentencePieceTokenizer(SpmModelPath());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const std::string text = "The river runs past the old mill, and the baker opens the shop.";
  const std::vector<int32_t> ids = *(*tokenizer)->Encode(text);
  EXPECT_EQ(JoinPieceBytes(**tokenizer, ids), text);
  for (size_t split = 1; split < ids.size(); ++split) {
    const std::vector<int32_t> head(ids.begin(), ids.begin() + split);
    std::string tail;
    for (size_t i = split; i < ids.size(); ++i) tail.append((*tokenizer)->PieceBytes(ids[i]));
    EXPECT_EQ((*tokenizer)->Decode(head) + tail, text) << "split " << split;
  }
  const std::vector<int32_t> mill = *(*tokenizer)->Encode("mill");
  ASSERT_EQ(mill.size(), 1u);
  EXPECT_EQ((*tokenizer)->PieceBytes(mill[0]), " mill");
  EXPECT_EQ((*tokenizer)->PieceBytes(mill[0], /*first=*/true), "mill");
  // Control pieces and ids outside the model add nothing; the unknown piece
  // its surface, wherever it is.
  EXPECT_EQ((*tokenizer)->PieceBytes(1), "");
  EXPECT_EQ((*tokenizer)->PieceBytes(2, /*first=*/true), "");
  EXPECT_EQ((*tokenizer)->PieceBytes(5000), "");
  const std::vector<int32_t> unknown = {0};
  EXPECT_EQ((*tokenizer)->PieceBytes(0), (*tokenizer)->Decode(unknown));
  EXPECT_EQ((*tokenizer)->PieceBytes(0, /*first=*/true), (*tokenizer)->Decode(unknown));
}

// A character the pieces do not cover is spelt as byte pieces; each is its
// byte, although Decode makes U+FFFD of one alone.
TEST(SentencePieceTokenizerTest, BytePiecesAreTheirBytes) {
  auto tokenizer = LoadSentencePieceTokenizer(ByteFallbackModelPath());
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const std::string text =
      "The caf\xc3\xa9 sells bread for \xe2\x82\xac"
      "5.";  // café, €
  const std::vector<int32_t> ids = *(*tokenizer)->Encode(text);
  EXPECT_EQ((*tokenizer)->Decode(ids), text);
  EXPECT_EQ(JoinPieceBytes(**tokenizer, ids), text);
  const std::vector<int32_t> euro = *(*tokenizer)->Encode("\xe2\x82\xac");
  ASSERT_EQ(euro.size(), 4u);  // "▁" then the three bytes
  EXPECT_EQ((*tokenizer)->PieceBytes(euro[1]), "\xe2");
  EXPECT_EQ((*tokenizer)->PieceBytes(euro[1], /*first=*/true), "\xe2");
  EXPECT_EQ((*tokenizer)->Decode({euro[1]}), "\xef\xbf\xbd");
}

TEST(SentencePieceTokenizerTest, MissingModelIsNotFound) {
  const std::string path = testing::MakeTempDir("spm_missing") + "/tokenizer.model";
  auto tokenizer = LoadSentencePieceTokenizer(path);
  EXPECT_EQ(tokenizer.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(tokenizer.status().message(), HasSubstr(path));
}

TEST(SentencePieceTokenizerTest, CorruptModelNamesTheFile) {
  const std::string dir = testing::MakeTempDir("spm_corrupt");
  const std::string path = dir + "/tokenizer.model";
  std::ofstream(path, std::ios::binary) << "this is not a protobuf \xff\xff\xff\xff";
  auto tokenizer = LoadSentencePieceTokenizer(path);
  EXPECT_EQ(tokenizer.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(tokenizer.status().message(), HasSubstr(path + ": not a valid SentencePiece model"));
  // A directory is not a model either.
  EXPECT_THAT(LoadSentencePieceTokenizer(dir).status().message(), HasSubstr("not a regular file"));
  // Nor is an empty file.
  const std::string empty = dir + "/empty.model";
  std::ofstream(empty, std::ios::binary).flush();
  EXPECT_FALSE(LoadSentencePieceTokenizer(empty).ok());
}

}  // namespace
}  // namespace switchserve
