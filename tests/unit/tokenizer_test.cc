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
