#include "server/wire_format.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "switchserve/v1/generation.pb.h"

namespace switchserve {
namespace {

grpc::ByteBuffer Bytes(const std::string& bytes) {
  grpc::Slice slice(bytes);
  return grpc::ByteBuffer(&slice, 1);
}

TEST(WireFormatTest, RoundTrip) {
  v1::GenerateRequest request;
  request.set_text("h\xC3\xA9llo");
  request.mutable_sampling()->add_stop(std::string("\n"));
  v1::GenerateRequest parsed;
  ASSERT_TRUE(ParseMessage(SerializeMessage(request), &parsed).ok());
  EXPECT_EQ(parsed.text(), request.text());
  EXPECT_EQ(parsed.sampling().stop(0), "\n");
}

TEST(WireFormatTest, FieldsSerializedApartFollowTheMessage) {
  // A stream's message with its tokens' detail serialized apart: the
  // detail's entries are appended to those the message holds.
  v1::GenerateStreamResponse message;
  message.set_text("ab");
  message.add_token_ids(97);
  message.add_token_ids(98);
  message.add_tokens()->set_token_id(96);
  message.set_finished(true);
  v1::GenerateStreamResponse detail;
  detail.add_tokens()->set_token_id(97);
  detail.add_tokens()->add_top_logprobs()->set_text("b");
  v1::GenerateStreamResponse parsed;
  ASSERT_TRUE(ParseMessage(SerializeMessage(message, detail.SerializeAsString()), &parsed).ok());
  EXPECT_EQ(parsed.text(), "ab");
  ASSERT_EQ(parsed.token_ids_size(), 2);
  EXPECT_TRUE(parsed.finished());
  ASSERT_EQ(parsed.tokens_size(), 3);
  EXPECT_EQ(parsed.tokens(0).token_id(), 96);
  EXPECT_EQ(parsed.tokens(1).token_id(), 97);
  EXPECT_EQ(parsed.tokens(2).top_logprobs(0).text(), "b");
  // Nothing apart: the message alone.
  ASSERT_TRUE(ParseMessage(SerializeMessage(message, ""), &parsed).ok());
  EXPECT_EQ(parsed.tokens_size(), 1);
}

TEST(WireFormatTest, NamesTheInvalidUtf8Field) {
  v1::GenerateRequest parsed;
  // Field 1 (text), 3 bytes, not UTF-8.
  absl::Status status = ParseMessage(Bytes(std::string("\x0a\x03"
                                                       "a\xff\xfe",
                                                       5)),
                                     &parsed);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "text: is not valid UTF-8");

  // Field 3 (sampling) holding field 8 (stop) = "\xc0\xaf" (overlong).
  const std::string sampling("\x42\x02\xc0\xaf", 4);
  const std::string request =
      absl::StrCat(std::string("\x0a\x01x", 3), "\x1a",
                   std::string(1, static_cast<char>(sampling.size())), sampling);
  status = ParseMessage(Bytes(request), &parsed);
  EXPECT_EQ(status.message(), "sampling.stop: is not valid UTF-8");
}

TEST(WireFormatTest, MalformedBytes) {
  v1::GenerateRequest parsed;
  absl::Status status = ParseMessage(Bytes("\x0a\x09short"), &parsed);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(), "malformed switchserve.v1.GenerateRequest message");
}

}  // namespace
}  // namespace switchserve
