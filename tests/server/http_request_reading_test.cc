#include "server/http/http_request_reading.h"

#include <gtest/gtest.h>

#include <boost/asio/buffer.hpp>
#include <boost/asio/error.hpp>
#include <boost/beast/http/error.hpp>
#include <memory>
#include <string>
#include <utility>

namespace switchserve::http_reading {
namespace {

namespace http = boost::beast::http;

constexpr int64_t kMaxBody = 1000;

// A head given to the parser at once, as a connection that has it all in its
// buffer does: the outcome AfterHeadRead gives it, with the bytes the parser
// took.
ReadOutcome HeadOutcome(const std::string& head, RequestParser* parser) {
  SetLimits(kMaxBody, parser);
  parser->eager(false);
  boost::beast::error_code ec;
  const size_t used = parser->put(boost::asio::buffer(head), ec);
  return AfterHeadRead(ec, used, *parser, kMaxBody);
}

// A head of `total` bytes: a short request line, Host and one long field.
std::string HeadOf(size_t total) {
  const std::string start = "GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ";
  return start + std::string(total - start.size() - 4, 'b') + "\r\n\r\n";
}

TEST(HttpRequestReadingTest, AHeadOverTheLimitIsRefusedWhateverItsRequestLine) {
  // Beast limits the request line and the fields each to 8 KiB: read at once,
  // a head with a short request line passed with up to 8 KiB of fields
  // besides (heads of up to 8,697 bytes were served).
  RequestParser at_limit;
  EXPECT_EQ(HeadOutcome(HeadOf(kMaxHeadBytes), &at_limit).kind, ReadOutcome::kGoOn);
  for (const size_t total : {kMaxHeadBytes + 1, kMaxHeadBytes + 22, kMaxHeadBytes + 51}) {
    RequestParser parser;
    const ReadOutcome outcome = HeadOutcome(HeadOf(total), &parser);
    EXPECT_EQ(outcome.kind, ReadOutcome::kAnswer) << total;
    EXPECT_EQ(outcome.status, 431) << total;
    EXPECT_FALSE(outcome.head_read);
  }
  // The same with a Content-Length over the body limit: 431 first.
  RequestParser parser;
  const std::string head = HeadOf(kMaxHeadBytes + 1);
  const ReadOutcome outcome =
      HeadOutcome(head.substr(0, head.size() - 2) + "Content-Length: 5000\r\n\r\n", &parser);
  EXPECT_EQ(outcome.status, 431);
}

TEST(HttpRequestReadingTest, HeadsAreAnsweredAsDocumented) {
  struct Case {
    std::string head;
    int status;  // 0: read on
  };
  const Case cases[] = {
      {"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 0},
      {"GET / HTTP/1.0\r\n\r\n", 0},
      {"GET / HTTP/1.1\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1001\r\n\r\n", 413},
      {"GET / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n", 501},
      {"GET / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501},
      {"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n", 400},
      {"GET / HTTP/2.0\r\nHost: x\r\n\r\n", 400},
      {"GET / HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n", 400},
      {"GET / HTTP/1.0\r\nHost: x\r\nhost: x\r\n\r\n", 400},
  };
  for (const Case& c : cases) {
    RequestParser parser;
    const ReadOutcome outcome = HeadOutcome(c.head, &parser);
    if (c.status == 0) {
      EXPECT_EQ(outcome.kind, ReadOutcome::kGoOn) << c.head;
    } else {
      EXPECT_EQ(outcome.kind, ReadOutcome::kAnswer) << c.head;
      EXPECT_EQ(outcome.status, c.status) << c.head << outcome.message;
    }
  }
}

TEST(HttpRequestReadingTest, RefusalsQuoteALongValueShortened) {
  const std::string value(4000, 'g');
  RequestParser parser;
  const ReadOutcome te =
      HeadOutcome("GET / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: " + value + "\r\n\r\n", &parser);
  EXPECT_EQ(te.status, 501);
  EXPECT_LT(te.message.size(), 200u) << te.message;
  EXPECT_NE(te.message.find("gggg..."), std::string::npos) << te.message;
  RequestParser expecting;
  ASSERT_EQ(
      HeadOutcome("POST / HTTP/1.1\r\nHost: x\r\nExpect: " + value + "\r\n\r\n", &expecting).kind,
      ReadOutcome::kGoOn);
  bool send_continue = true;
  const ReadOutcome expect = CheckExpectation(expecting, &send_continue);
  EXPECT_EQ(expect.status, 417);
  EXPECT_LT(expect.message.size(), 200u) << expect.message;
}

TEST(HttpRequestReadingTest, OnlyAnHttp11ExpectOtherThan100ContinueIsRefused) {
  struct Case {
    std::string head;
    int status;
    bool send_continue;
  };
  const Case cases[] = {
      {"POST / HTTP/1.1\r\nHost: x\r\n\r\n", 0, false},
      {"POST / HTTP/1.1\r\nHost: x\r\nExpect: 100-Continue\r\n\r\n", 0, true},
      {"POST / HTTP/1.0\r\nExpect: 100-continue\r\n\r\n", 0, false},
      {"POST / HTTP/1.0\r\nExpect: x\r\n\r\n", 0, false},
      {"POST / HTTP/1.1\r\nHost: x\r\nExpect: x\r\n\r\n", 417, false},
  };
  for (const Case& c : cases) {
    RequestParser parser;
    ASSERT_EQ(HeadOutcome(c.head, &parser).kind, ReadOutcome::kGoOn) << c.head;
    bool send_continue = true;
    const ReadOutcome outcome = CheckExpectation(parser, &send_continue);
    EXPECT_EQ(outcome.status, c.status) << c.head;
    EXPECT_EQ(send_continue, c.send_continue) << c.head;
  }
}

TEST(HttpRequestReadingTest, ReadErrorsAreAnsweredOrClose) {
  RequestParser parser;
  SetLimits(kMaxBody, &parser);
  EXPECT_EQ(AfterBodyRead(http::error::body_limit, parser, kMaxBody).status, 413);
  EXPECT_EQ(AfterBodyRead(http::error::buffer_overflow, parser, kMaxBody).status, 400);
  EXPECT_EQ(AfterBodyRead(http::error::bad_chunk, parser, kMaxBody).status, 400);
  EXPECT_EQ(AfterBodyRead(http::error::partial_message, parser, kMaxBody).kind,
            ReadOutcome::kClose);
  EXPECT_EQ(AfterBodyRead(http::error::end_of_stream, parser, kMaxBody).kind, ReadOutcome::kClose);
  EXPECT_EQ(AfterBodyRead(boost::asio::error::connection_reset, parser, kMaxBody).kind,
            ReadOutcome::kClose);
  EXPECT_EQ(AfterBodyRead({}, parser, kMaxBody).kind, ReadOutcome::kGoOn);
}

TEST(HttpRequestReadingTest, AbsoluteFormTargetsAreServedAsTheirPathAndQuery) {
  EXPECT_EQ(OriginForm("/v1/models?x=1"), "/v1/models?x=1");
  EXPECT_EQ(OriginForm("http://host:80/v1/models?x=1"), "/v1/models?x=1");
  EXPECT_EQ(OriginForm("HTTPS://host?x=1"), "/?x=1");
  EXPECT_EQ(OriginForm("http://host"), "/");
  EXPECT_EQ(OriginForm("http://"), "/");
  EXPECT_EQ(OriginForm("*"), "*");
}

TEST(HttpRequestReadingTest, RequestsKeepFieldsAndLowerCaseTheirNames) {
  RequestParser parser;
  ASSERT_EQ(
      HeadOutcome("GET http://h/a?b HTTP/1.1\r\nHost: h\r\nX-Id:  v 1 \r\nx-id: 2\r\n\r\n", &parser)
          .kind,
      ReadOutcome::kGoOn);
  const HttpRequest request = RequestOf(parser.get(), "ipv4:1.2.3.4:5");
  EXPECT_EQ(request.method, "GET");
  EXPECT_EQ(request.target, "/a?b");
  EXPECT_EQ(request.Path(), "/a");
  EXPECT_EQ(request.peer, "ipv4:1.2.3.4:5");
  const std::vector<std::pair<std::string, std::string>> headers = {
      {"host", "h"}, {"x-id", "v 1"}, {"x-id", "2"}};
  EXPECT_EQ(request.headers, headers);
  EXPECT_EQ(request.Header("x-id"), "v 1");
}

TEST(HttpRequestReadingTest, EmptyLinesBeforeARequestLineAreCounted) {
  EXPECT_EQ(EmptyLineBytes(""), 0u);
  EXPECT_EQ(EmptyLineBytes("GET / HTTP/1.1\r\n"), 0u);
  EXPECT_EQ(EmptyLineBytes("\r\nGET / HTTP/1.1\r\n"), 2u);
  EXPECT_EQ(EmptyLineBytes("\r\n\r\n\nPOST"), 5u);
  EXPECT_EQ(EmptyLineBytes("\r\n"), 2u);
  EXPECT_EQ(EmptyLineBytes(" \r\n"), 0u);
  // What is left parses as a request.
  const std::string sent = "\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n";
  RequestParser parser;
  EXPECT_EQ(HeadOutcome(sent.substr(EmptyLineBytes(sent)), &parser).kind, ReadOutcome::kGoOn);
  RequestParser unskipped;
  EXPECT_EQ(HeadOutcome(sent, &unskipped).status, 400);
}

TEST(HttpRequestReadingTest, ABodyPastTheBudgetIsAnswered429WithRetryAfter) {
  const ByteBudget budget(1000);
  const ReadOutcome outcome = BodyBudgetExhausted(budget);
  EXPECT_EQ(outcome.kind, ReadOutcome::kAnswer);
  EXPECT_EQ(outcome.status, 429);
  EXPECT_TRUE(outcome.head_read);
  EXPECT_EQ(outcome.retry_after_s, 1);
  EXPECT_NE(outcome.message.find("1000 bytes"), std::string::npos) << outcome.message;
}

}  // namespace
}  // namespace switchserve::http_reading
