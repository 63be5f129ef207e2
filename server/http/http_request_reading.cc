#include "server/http/http_request_reading.h"

#include <boost/beast/core/string.hpp>
#include <boost/beast/http/error.hpp>
#include <cstring>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "server/http/openai_protocol.h"

namespace switchserve::http_reading {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;

ReadOutcome Answer(int status, std::string message, bool head_read) {
  return {.kind = ReadOutcome::kAnswer,
          .status = status,
          .message = std::move(message),
          .head_read = head_read};
}

ReadOutcome HeadTooLarge() {
  return Answer(431, absl::StrCat("the request's head is larger than ", kMaxHeadBytes, " bytes"),
                /*head_read=*/false);
}

// A failed read: the answer, or kClose.
ReadOutcome ReadError(const beast::error_code& ec, const RequestParser& parser,
                      int64_t max_body_bytes) {
  if (ec == http::error::header_limit) return HeadTooLarge();
  if (ec == http::error::body_limit) {
    // The limit applies once the head is read (to its Content-Length) or
    // within the body.
    return Answer(413,
                  absl::StrCat("the request body is larger than ", max_body_bytes,
                               " bytes (--max-request-bytes)"),
                  /*head_read=*/true);
  }
  const bool malformed =
      ec.category() == http::make_error_code(http::error::bad_target).category() &&
      ec != http::error::end_of_stream && ec != http::error::partial_message;
  if (malformed) {
    return Answer(400, absl::StrCat("malformed HTTP request: ", ec.message()),
                  parser.is_header_done());
  }
  ReadOutcome close;  // the client closed, timed out or reset the connection
  close.kind = ReadOutcome::kClose;
  return close;
}

}  // namespace

void SetLimits(int64_t max_body_bytes, RequestParser* parser) {
  parser->header_limit(static_cast<std::uint32_t>(kMaxHeadBytes));
  parser->body_limit(static_cast<uint64_t>(max_body_bytes));
}

ReadOutcome AfterHeadRead(const beast::error_code& ec, size_t head_bytes,
                          const RequestParser& parser, int64_t max_body_bytes) {
  // Beast limits the request line and the fields each to kMaxHeadBytes
  // (and, as the bytes arrive in pieces, sometimes together): the head is
  // counted whole here, whatever the pieces, before any other answer.
  if (head_bytes > kMaxHeadBytes && (!ec || ec == http::error::body_limit)) return HeadTooLarge();
  if (ec) return ReadError(ec, parser, max_body_bytes);
  const RequestMessage& head = parser.get();
  // RFC 9112 3.2: an HTTP/1.1 request without a Host field is refused.
  if (head.version() >= 11 && head.find(http::field::host) == head.end()) {
    return Answer(400, "malformed HTTP request: an HTTP/1.1 request needs a Host field",
                  /*head_read=*/true);
  }
  // RFC 9112 3.2: and one with more than one is refused too.
  if (head.count(http::field::host) > 1) {
    return Answer(400, "malformed HTTP request: more than one Host field", /*head_read=*/true);
  }
  // RFC 9112: a Transfer-Encoding this server does not decode, beside a
  // Content-Length it would use instead, could frame the message unlike a
  // proxy in front did.
  if (const auto te = head[http::field::transfer_encoding];
      !te.empty() && !beast::iequals(te, "chunked")) {
    return Answer(501,
                  absl::StrCat("Transfer-Encoding \"", ShownName(std::string(te)),
                               "\": only \"chunked\" is supported"),
                  /*head_read=*/true);
  }
  return {};
}

ReadOutcome CheckExpectation(const RequestParser& parser, bool* send_continue) {
  *send_continue = false;
  // RFC 9110 10.1.1: an HTTP/1.0 client gets no 100 (Continue), and an
  // expectation other than 100-continue cannot be met.
  const RequestMessage& head = parser.get();
  const auto expect = head[http::field::expect];
  if (expect.empty() || head.version() < 11) return {};
  if (!beast::iequals(expect, "100-continue")) {
    return Answer(417,
                  absl::StrCat("Expect \"", ShownName(std::string(expect)),
                               "\": only \"100-continue\" is supported"),
                  /*head_read=*/true);
  }
  *send_continue = true;
  return {};
}

ReadOutcome AfterBodyRead(const beast::error_code& ec, const RequestParser& parser,
                          int64_t max_body_bytes) {
  if (ec) return ReadError(ec, parser, max_body_bytes);
  return {};
}

size_t EmptyLineBytes(std::string_view data) {
  size_t n = 0;
  while (n < data.size() && (data[n] == '\r' || data[n] == '\n')) ++n;
  return n;
}

ReadOutcome BodyBudgetExhausted(const ByteBudget& budget) {
  ReadOutcome outcome = Answer(429,
                               absl::StrCat("the server holds as many request bodies as it may (",
                                            budget.limit(), " bytes in all); retry later"),
                               /*head_read=*/true);
  outcome.retry_after_s = 1;
  return outcome;
}

std::string OriginForm(const std::string& target) {
  for (const char* scheme : {"http://", "https://"}) {
    if (!absl::StartsWithIgnoreCase(target, scheme)) continue;
    const size_t path = target.find_first_of("/?", std::strlen(scheme));
    if (path == std::string::npos) return "/";
    return target[path] == '?' ? absl::StrCat("/", target.substr(path)) : target.substr(path);
  }
  return target;
}

HttpRequest RequestOf(const RequestMessage& message, std::string peer) {
  HttpRequest request;
  request.method = std::string(message.method_string());
  request.target = OriginForm(std::string(message.target()));
  for (const auto& field : message) {
    request.headers.emplace_back(absl::AsciiStrToLower(std::string(field.name_string())),
                                 std::string(field.value()));
  }
  request.peer = std::move(peer);
  return request;
}

}  // namespace switchserve::http_reading
