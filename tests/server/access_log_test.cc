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

TEST(LogLineTest, ParseLogFormat) {
  EXPECT_EQ(*ParseLogFormat("text"), LogFormat::kText);
  EXPECT_EQ(*ParseLogFormat("json"), LogFormat::kJson);
  EXPECT_FALSE(ParseLogFormat("JSON").ok());
  EXPECT_FALSE(ParseLogFormat("").ok());
}

}  // namespace
}  // namespace switchserve
