#include "server/access_log.h"

#include <gtest/gtest.h>

#include <set>
#include <string>

#include "nlohmann/json.hpp"
#include "server/log.h"

namespace switchserve {
namespace {

TEST(RequestIdTest, KeepsAUsableClientIdAndReplacesOthers) {
  EXPECT_EQ(AcceptOrMakeRequestId("abc-123_XYZ.~"), "abc-123_XYZ.~");
  const std::string longest(kMaxRequestIdLength, 'r');
  EXPECT_EQ(AcceptOrMakeRequestId(longest), longest);
  for (const std::string& bad :
       {std::string(), std::string("has space"), std::string("tab\t"), std::string("new\nline"),
        std::string("caf\xc3\xa9"), std::string(kMaxRequestIdLength + 1, 'r')}) {
    const std::string id = AcceptOrMakeRequestId(bad);
    EXPECT_NE(id, bad);
    EXPECT_EQ(id.size(), 32u) << bad;
    EXPECT_EQ(id.find_first_not_of("0123456789abcdef"), std::string::npos) << id;
  }
}

TEST(RequestIdTest, MadeIdsDiffer) {
  std::set<std::string> ids;
  for (int i = 0; i < 1000; ++i) ids.insert(AcceptOrMakeRequestId(std::nullopt));
  EXPECT_EQ(ids.size(), 1000u);
}

TEST(LogLineTest, TextFormHasMessageThenFields) {
  const LogFields fields = {{"request_id", "r1"},
                            {"status", "OK"},
                            {"peer", "ipv4:1.2.3.4:5"},
                            {"total_ms", 12.5},
                            {"note", "two words"}};
  EXPECT_EQ(FormatLogLine(LogFormat::kText, "2024-01-02T03:04:05.678Z", LogLevel::kInfo, "request",
                          fields),
            "2024-01-02T03:04:05.678Z switchserve: request request_id=r1 status=OK "
            "peer=ipv4:1.2.3.4:5 total_ms=12.5 note=\"two words\"");
  EXPECT_EQ(FormatLogLine(LogFormat::kText, "T", LogLevel::kError, "boom", {}),
            "T switchserve: error: boom");
}

TEST(LogLineTest, JsonFormIsOneObjectWithTimeLevelMessageAndFields) {
  const std::string line =
      FormatLogLine(LogFormat::kJson, "2024-01-02T03:04:05.678Z", LogLevel::kWarning, "say \"hi\"",
                    {{"request_id", "r\xff"}, {"completion_tokens", 7}});
  EXPECT_EQ(line.find('\n'), std::string::npos);
  const nlohmann::json parsed = nlohmann::json::parse(line);
  EXPECT_EQ(parsed["time"], "2024-01-02T03:04:05.678Z");
  EXPECT_EQ(parsed["level"], "warning");
  EXPECT_EQ(parsed["msg"], "say \"hi\"");
  EXPECT_EQ(parsed["completion_tokens"], 7);
  EXPECT_EQ(parsed["request_id"], "r\xef\xbf\xbd");  // invalid UTF-8 replaced, not thrown
  EXPECT_EQ(line.rfind("{\"time\":", 0), 0u);        // time first, for humans reading raw logs
}

TEST(LogLineTest, TextFormEscapesControlCharactersInTheMessageAndValues) {
  // What gRPC core writes for a grpc-encoding header a client made of a
  // newline, a forged access-log line and an ESC sequence.
  const std::string forged =
      "grpc: Error parsing metadata: error=invalid value key=grpc-encoding value=x\n"
      "2026-12-05T22:50:00.000Z switchserve: request request_id=forged status=OK\x1b[2K";
  const std::string line = FormatLogLine(LogFormat::kText, "T", LogLevel::kError, forged,
                                         {{"v",
                                           "a\x1b"
                                           "b"}});
  EXPECT_EQ(line,
            "T switchserve: error: grpc: Error parsing metadata: error=invalid value "
            "key=grpc-encoding value=x\\n2026-12-05T22:50:00.000Z switchserve: request "
            "request_id=forged status=OK\\u001b[2K v=\"a\\u001bb\"");
  // Every C0 control, DEL and C1 (U+0080 to U+009F, as UTF-8), in a message
  // and in a value, which had been left plain when it held no space or quote.
  for (int code = 0; code < 0xa0; ++code) {
    if (code >= 0x20 && code < 0x7f) continue;
    const std::string c = code < 0x80 ? std::string(1, static_cast<char>(code))
                                      : std::string{'\xc2', static_cast<char>(code)};
    const std::string text = "<" + c + ">";
    const std::string escaped =
        FormatLogLine(LogFormat::kText, "T", LogLevel::kInfo, text, {{"value", text}});
    for (unsigned char byte : escaped) {
      EXPECT_TRUE(byte >= 0x20 && byte < 0x7f) << "code " << code << ": " << escaped;
    }
    // JSON reads the value's escape back as the character.
    const size_t quote = escaped.find("value=\"");
    ASSERT_NE(quote, std::string::npos) << escaped;
    EXPECT_EQ(nlohmann::json::parse(escaped.substr(quote + 6)), text) << escaped;
  }
  EXPECT_EQ(EscapeLogText("\r\n\t\x7f\xc2\x9b", false), "\\r\\n\\t\\u007f\\u009b");
  // Quotes and backslashes stay in a message, are escaped in a quoted value.
  EXPECT_EQ(EscapeLogText("say \"a\\b\"", false), "say \"a\\b\"");
  EXPECT_EQ(EscapeLogText("say \"a\\b\"", true), "say \\\"a\\\\b\\\"");
  // Printable text beyond ASCII stays; a byte that is no UTF-8 is U+FFFD,
  // so a lone 0x9b (CSI to an 8-bit terminal) cannot pass either.
  EXPECT_EQ(EscapeLogText("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", false),
            "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
  EXPECT_EQ(EscapeLogText("a\x9b"
                          "b\xc2",
                          false),
            "a\xef\xbf\xbd"
            "b\xef\xbf\xbd");
  std::string five_replacements;
  for (int i = 0; i < 5; ++i) five_replacements += "\xef\xbf\xbd";
  EXPECT_EQ(EscapeLogText("\xc0\x8a\xed\xa0\x80", false),  // an overlong LF, a surrogate
            five_replacements);
  // Values that need nothing stay plain, as before.
  EXPECT_EQ(FormatLogLine(LogFormat::kText, "T", LogLevel::kInfo, "m",
                          {{"peer", "ipv4:1.2.3.4:5"}, {"path", "/v1/caf\xc3\xa9"}, {"n", 3}}),
            "T switchserve: m peer=ipv4:1.2.3.4:5 path=/v1/caf\xc3\xa9 n=3");
}

TEST(LogLineTest, JsonFormEscapesDelAndC1Too) {
  const std::string line = FormatLogLine(LogFormat::kJson, "T", LogLevel::kError,
                                         "a\nb\x1b\x7f\xc2\x9b", {{"v", "\x1b\xc2\x85"}});
  for (unsigned char byte : line) EXPECT_TRUE(byte >= 0x20 && byte < 0x7f) << line;
  const nlohmann::json parsed = nlohmann::json::parse(line);
  EXPECT_EQ(parsed["msg"], "a\nb\x1b\x7f\xc2\x9b");
  EXPECT_EQ(parsed["v"], "\x1b\xc2\x85");
}

TEST(LogLineBudgetTest, AdmitsSoManyLinesAWindowAndCountsTheRest) {
  using Clock = LogLineBudget::Clock;
  LogLineBudget budget(3, std::chrono::seconds(1));
  const Clock::time_point t0 = Clock::now();
  int64_t suppressed = -1;
  for (int i = 0; i < 3; ++i) {
    EXPECT_TRUE(budget.Admit(t0 + std::chrono::milliseconds(i), &suppressed)) << i;
    EXPECT_EQ(suppressed, 0);
  }
  for (int i = 0; i < 5; ++i) {
    EXPECT_FALSE(budget.Admit(t0 + std::chrono::milliseconds(500 + i), &suppressed)) << i;
  }
  // The window opened at t0 is still open just before a second has passed.
  EXPECT_FALSE(budget.Admit(t0 + std::chrono::milliseconds(999), &suppressed));
  // A new window: the first line reports the 6 dropped, the next none.
  EXPECT_TRUE(budget.Admit(t0 + std::chrono::milliseconds(1000), &suppressed));
  EXPECT_EQ(suppressed, 6);
  EXPECT_TRUE(budget.Admit(t0 + std::chrono::milliseconds(1001), &suppressed));
  EXPECT_EQ(suppressed, 0);
  // A window opens with the first line after the last one closed, not on a
  // fixed grid: after a quiet minute, three lines again.
  const Clock::time_point later = t0 + std::chrono::seconds(60) + std::chrono::milliseconds(700);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(budget.Admit(later, &suppressed)) << i;
  EXPECT_FALSE(budget.Admit(later + std::chrono::milliseconds(999), &suppressed));
}

TEST(LogLineTest, ParseLogFormat) {
  EXPECT_EQ(*ParseLogFormat("text"), LogFormat::kText);
  EXPECT_EQ(*ParseLogFormat("json"), LogFormat::kJson);
  EXPECT_FALSE(ParseLogFormat("JSON").ok());
  EXPECT_FALSE(ParseLogFormat("").ok());
}

}  // namespace
}  // namespace switchserve
