// How the HTTP server turns a connection's bytes into requests: the parser's
// limits, the answers it gives a request itself (and when it only closes the
// connection), and the HttpRequest it hands to the handler. The connection in
// http_session.cc reads with Boost.Beast and decides with these, step by step;
// tests/fuzz/http_request_fuzz.cc takes the same steps over bytes in memory.
#ifndef SWITCHSERVE_SERVER_HTTP_HTTP_REQUEST_READING_H_
#define SWITCHSERVE_SERVER_HTTP_HTTP_REQUEST_READING_H_

#include <boost/beast/core/error.hpp>
#include <boost/beast/http/message.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>

#include "server/byte_budget.h"
#include "server/http/http_request.h"

namespace switchserve::http_reading {

// The request line and header fields together, and the bytes a connection
// buffers while the parser looks for the end of a line (a chunk's size and
// extensions, a trailer field).
inline constexpr size_t kMaxHeadBytes = 8192;
inline constexpr size_t kMaxBufferedBytes = 64 * 1024;

using RequestParser = boost::beast::http::request_parser<boost::beast::http::string_body>;
using RequestMessage = boost::beast::http::request<boost::beast::http::string_body>;

// Sets the limits of a fresh parser: the head (Beast counts the request line
// and the fields apart; AfterHeadRead counts them together) and the body,
// HttpServerOptions::max_body_bytes.
void SetLimits(int64_t max_body_bytes, RequestParser* parser);

// What the connection does after a step.
struct ReadOutcome {
  enum Kind {
    kGoOn,    // read on (the body), or hand the request on
    kAnswer,  // answer `status` with `message`, then close the connection
    kClose,   // close without an answer: the client closed, reset or timed out
  };
  Kind kind = kGoOn;
  int status = 0;
  std::string message;
  // kAnswer: the request's head was read whole (on_own_error is called).
  bool head_read = false;
  // kAnswer: a Retry-After (seconds) to send with it; 0: none.
  int retry_after_s = 0;
};

// RFC 9112 2.2: the empty lines (CR, LF) a client may send before a request
// line, such as a CRLF after the previous request's body: how many bytes at
// the start of `data` they take. The connection drops them before it reads
// a head.
size_t EmptyLineBytes(std::string_view data);

// After the read of a request's head (HttpServerOptions::check_head comes
// next): `ec` and `head_bytes` as async_read_header reports them (the bytes
// the parser took). 431 for a head over kMaxHeadBytes, 413 for a
// Content-Length over `max_body_bytes`, 400 for a malformed head or an
// HTTP/1.1 request without Host, 501 for a Transfer-Encoding other than
// chunked; kClose when the connection ended first.
ReadOutcome AfterHeadRead(const boost::beast::error_code& ec, size_t head_bytes,
                          const RequestParser& parser, int64_t max_body_bytes);

// After check_head let the request pass: 417 for an Expect other than
// 100-continue (from an HTTP/1.1 client); otherwise kGoOn, with
// `*send_continue` set when `100 Continue` goes out before the body is read.
ReadOutcome CheckExpectation(const RequestParser& parser, bool* send_continue);

// After the read of the body: 413 past `max_body_bytes`, 400 for a
// malformed body or a line between head and body past kMaxBufferedBytes;
// kClose when the connection ended first; kGoOn with the whole request.
ReadOutcome AfterBodyRead(const boost::beast::error_code& ec, const RequestParser& parser,
                          int64_t max_body_bytes);

// The answer to a request whose body does not fit in what is left of
// `budget` (the request-body bytes all connections together may hold,
// HttpServerOptions::max_buffered_body_bytes: a body's declared
// Content-Length is taken before it is read, a chunked body's buffer as it
// grows): 429 with Retry-After, as a full queue is answered (the
// connection closes).
ReadOutcome BodyBudgetExhausted(const ByteBudget& budget);

// A target in absolute form (RFC 9112 3.2.2: "http://host/path?query", as
// sent to a proxy) as its path and query; any other target as sent.
std::string OriginForm(const std::string& target);

// The method, target (OriginForm), headers (names lower-case) and `peer` of
// `message`, without its body.
HttpRequest RequestOf(const RequestMessage& message, std::string peer);

}  // namespace switchserve::http_reading

#endif  // SWITCHSERVE_SERVER_HTTP_HTTP_REQUEST_READING_H_
