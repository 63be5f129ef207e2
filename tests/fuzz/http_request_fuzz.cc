// The HTTP server's request reading (server/http/http_request_reading.h):
// bytes in memory, handed to the parser in pieces of a size the input picks,
// through the steps a connection takes (read the head, check it and its
// Expect, read the body, hand the request on, read the next request from the
// same buffer while the connection is kept alive).
//
// The first byte picks the input's kind:
// - raw (even): the rest is the connection's bytes ("\xff\xff", a 16-bit
//   little-endian count and a byte stand for that byte repeated, to reach
//   the 8 KiB head and 64 KiB buffer limits). Every answer is one of the
//   documented statuses (400, 413, 417, 431, 501); the connection closes
//   unanswered only when the bytes ran out; an accepted request has a head
//   of at most 8 KiB, a body within the limit, lower-case header names, Host
//   (HTTP/1.1), no Transfer-Encoding but chunked, no Expect but
//   100-continue, and a target in origin form where it was sent in absolute
//   form.
// - structured (odd): the rest describes up to three pipelined requests
//   (method, target in origin or absolute form, version, Host, other fields,
//   Expect, Connection, framing by Content-Length or chunks with extensions
//   and trailers, conflicting framing, bodies and heads around the limits),
//   which are written out here. The outcome must be exactly the one
//   predicted from the description: the documented status, or each request
//   with its method, target (path and query), every header field (names
//   lower-case, values without surrounding white space) and body, kept
//   alive as its version and Connection say.
#include <algorithm>
#include <boost/asio/buffer.hpp>
#include <boost/asio/error.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/system/system_error.hpp>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "server/http/http_request_reading.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using switchserve::HttpRequest;
using namespace switchserve::http_reading;

// A connection's bytes, read in pieces of at most `piece` bytes (and at most
// what the parser's buffer asks for, as from a socket).
class MemoryStream {
 public:
  MemoryStream(std::string_view bytes, size_t piece) : bytes_(bytes), piece_(piece) {}

  template <class Buffers>
  size_t read_some(const Buffers& buffers, beast::error_code& ec) {
    if (at_ == bytes_.size()) {
      ec = net::error::eof;
      return 0;
    }
    ec = {};
    const size_t n = net::buffer_copy(
        buffers, net::buffer(bytes_.data() + at_, std::min(piece_, bytes_.size() - at_)));
    at_ += n;
    return n;
  }
  template <class Buffers>
  size_t read_some(const Buffers& buffers) {
    beast::error_code ec;
    const size_t n = read_some(buffers, ec);
    if (ec) throw boost::system::system_error(ec);
    return n;
  }
  bool exhausted() const { return at_ == bytes_.size(); }

 private:
  std::string_view bytes_;
  size_t piece_;
  size_t at_ = 0;
};

// One request's fate on the connection.
struct Step {
  ReadOutcome outcome;
  // kGoOn: the request handed on.
  HttpRequest request;
  bool keep_alive = false;
  int version = 0;
  std::string target_sent;
  size_t head_bytes = 0;
};

// The connection's steps (http_session.cc's Session, without the handler and
// the writes): requests until one is answered by the server itself or the
// connection ends. No check_head: every head goes on.
std::vector<Step> Serve(MemoryStream* stream, int64_t max_body_bytes) {
  beast::flat_buffer buffer(kMaxBufferedBytes);
  std::vector<Step> steps;
  for (;;) {
    Step step;
    RequestParser parser;
    SetLimits(max_body_bytes, &parser);
    beast::error_code ec;
    step.head_bytes = http::read_header(*stream, buffer, parser, ec);
    step.outcome = AfterHeadRead(ec, step.head_bytes, parser, max_body_bytes);
    bool send_continue = false;
    if (step.outcome.kind == ReadOutcome::kGoOn) {
      step.outcome = CheckExpectation(parser, &send_continue);
    }
    if (step.outcome.kind == ReadOutcome::kGoOn) {
      http::read(*stream, buffer, parser, ec);
      step.outcome = AfterBodyRead(ec, parser, max_body_bytes);
    }
    if (step.outcome.kind != ReadOutcome::kGoOn) {
      steps.push_back(std::move(step));
      return steps;
    }
    RequestMessage message = parser.release();
    step.request = RequestOf(message, "peer");
    step.request.body = std::move(message.body());
    step.keep_alive = message.keep_alive();
    step.version = static_cast<int>(message.version());
    step.target_sent = std::string(message.target());
    const bool keep_alive = step.keep_alive;
    steps.push_back(std::move(step));
    if (!keep_alive) return steps;
  }
}

constexpr int64_t kBodyLimits[] = {0, 1, 10, 100, 1000, 5000, 65536, int64_t{4} << 20};

size_t PieceSize(uint8_t pick) {
  if (pick == 0) return std::numeric_limits<size_t>::max();
  return pick < 128 ? pick : static_cast<size_t>(pick - 127) * 512;
}

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return absl::ascii_tolower(static_cast<unsigned char>(x)) ==
                  absl::ascii_tolower(static_cast<unsigned char>(y));
         });
}

bool IsAnswerStatus(int status) {
  return status == 400 || status == 413 || status == 417 || status == 431 || status == 501;
}

// Reads the input from the front; zeros once it is used up.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t Byte() { return at_ < size_ ? data_[at_++] : 0; }
  size_t Below(size_t n) { return Byte() % n; }
  size_t U16() {
    const size_t low = Byte();
    return low | (size_t{Byte()} << 8);
  }
  // Up to `max` bytes, mapped onto `alphabet` (empty: bytes as they are).
  std::string Text(size_t max, std::string_view alphabet = {}) {
    const size_t n = Below(max + 1);
    std::string out;
    for (size_t i = 0; i < n; ++i) {
      const uint8_t b = Byte();
      out.push_back(alphabet.empty() ? static_cast<char>(b) : alphabet[b % alphabet.size()]);
    }
    return out;
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t at_ = 0;
};

// --- raw bytes ---

std::string Expand(const uint8_t* data, size_t size) {
  std::string out;
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == 0xff && i + 4 < size && data[i + 1] == 0xff) {
      out.append(data[i + 2] | (size_t{data[i + 3]} << 8), static_cast<char>(data[i + 4]));
      i += 4;
    } else {
      out.push_back(static_cast<char>(data[i]));
    }
  }
  return out;
}

void CheckRaw(const std::vector<Step>& steps, const MemoryStream& stream, int64_t max_body_bytes) {
  FUZZ_CHECK(!steps.empty());
  for (size_t i = 0; i + 1 < steps.size(); ++i) {
    FUZZ_CHECK(steps[i].outcome.kind == ReadOutcome::kGoOn && steps[i].keep_alive);
  }
  for (const Step& step : steps) {
    const ReadOutcome& outcome = step.outcome;
    if (outcome.kind == ReadOutcome::kClose) {
      FUZZ_CHECK(stream.exhausted());
      continue;
    }
    if (outcome.kind == ReadOutcome::kAnswer) {
      FUZZ_CHECK(IsAnswerStatus(outcome.status));
      FUZZ_CHECK(!outcome.message.empty());
      // 431: the head could not be read; 413, 417 and 501 answer a head
      // read whole (a 400 may come either way).
      if (outcome.status == 431) FUZZ_CHECK(!outcome.head_read);
      if (outcome.status == 413 || outcome.status == 417 || outcome.status == 501) {
        FUZZ_CHECK(outcome.head_read);
      }
      continue;
    }
    const HttpRequest& request = step.request;
    FUZZ_CHECK(step.head_bytes <= kMaxHeadBytes);
    FUZZ_CHECK(!request.method.empty() && !request.target.empty());
    FUZZ_CHECK(static_cast<int64_t>(request.body.size()) <= max_body_bytes);
    for (const auto& [name, value] : request.headers) {
      FUZZ_CHECK(!name.empty() && absl::AsciiStrToLower(name) == name);
    }
    FUZZ_CHECK(step.version == 10 || step.version == 11);
    if (step.version == 11) FUZZ_CHECK(request.Header("host").has_value());
    FUZZ_CHECK(std::count_if(request.headers.begin(), request.headers.end(),
                             [](const auto& field) { return field.first == "host"; }) <= 1);
    if (const auto te = request.Header("transfer-encoding")) {
      FUZZ_CHECK(te->empty() || EqualsIgnoreCase(*te, "chunked"));
    }
    if (const auto expect = request.Header("expect"); expect && step.version == 11) {
      FUZZ_CHECK(expect->empty() || EqualsIgnoreCase(*expect, "100-continue"));
    }
    for (const char* scheme : {"http://", "https://"}) {
      if (EqualsIgnoreCase(
              std::string_view(step.target_sent).substr(0, std::string_view(scheme).size()),
              scheme)) {
        FUZZ_CHECK(request.target[0] == '/');
        FUZZ_CHECK(std::string_view(step.target_sent).find(request.target.substr(1)) !=
                   std::string_view::npos);
      }
    }
  }
}

// --- structured requests ---

constexpr std::string_view kTokenChars =
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789!#$%&'*+-.^_`|~";
constexpr std::string_view kPathChars =
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-._~!$&'()*+,;=:@/?%";
constexpr std::string_view kAuthorityChars = "abcdefghijklmnopqrstuvwxyz0123456789.-:@[]";

// A field value's byte: VCHAR or obs-text as it is, other bytes as white space.
char ValueChar(uint8_t b) {
  if ((b >= 0x21 && b <= 0x7e) || b >= 0x80) return static_cast<char>(b);
  return b & 1 ? ' ' : '\t';
}

std::string TrimOws(const std::string& value) {
  const size_t first = value.find_first_not_of(" \t");
  if (first == std::string::npos) return "";
  return value.substr(first, value.find_last_not_of(" \t") - first + 1);
}

// What reading the request must give.
struct Prediction {
  // 0: the request is handed on; else the status the server answers (a
  // second one allowed where the order of two faults is Beast's to choose).
  int status = 0;
  int other_status = 0;
  HttpRequest request;
  bool keep_alive = false;
};

struct Field {
  std::string name, value;
};

// Writes one request the reader describes to `out` and predicts its outcome.
Prediction WriteRequest(Reader& in, int64_t max_body_bytes, std::string* out) {
  Prediction p;
  const bool http11 = in.Byte() & 1;
  static constexpr const char* kMethods[] = {"GET",   "POST",    "HEAD",   "PUT",
                                             "PATCH", "OPTIONS", "DELETE", "M-SEARCH"};
  const std::string method = kMethods[in.Below(8)];

  // The target, and the path and query it is served as.
  std::string target, served;
  std::string path = "/" + in.Text(40, kPathChars);
  path.append(in.U16() % 10000, 'p');
  switch (in.Below(4)) {
    case 0:
    case 1:
      target = served = path;
      break;
    case 2: {
      static constexpr const char* kSchemes[] = {"http://", "https://", "HTTP://", "hTtPs://"};
      std::string rest;
      switch (in.Below(3)) {
        case 0:
          served = "/";
          break;
        case 1:
          rest = served = path;
          break;
        default:
          rest = "?" + in.Text(20, kPathChars);
          served = "/" + rest;
          break;
      }
      target = kSchemes[in.Below(4)];
      target += in.Text(16, kAuthorityChars) + rest;
      break;
    }
    default:
      target = served = "*";
      break;
  }

  std::vector<Field> fields;
  switch (in.Below(3)) {
    case 0:
      break;
    case 1:
      fields.push_back({"Host", in.Text(16, kAuthorityChars)});
      break;
    default:
      fields.push_back({"host", ""});
      break;
  }
  const bool has_host = !fields.empty();
  for (size_t n = in.Below(5); n > 0; --n) {
    Field field{in.Text(12, kTokenChars), ""};
    if (field.name.empty()) field.name = "x";
    const std::string lower = absl::AsciiStrToLower(field.name);
    for (const char* special : {"host", "content-length", "transfer-encoding", "expect",
                                "connection", "proxy-connection", "upgrade"}) {
      if (lower == special) field.name = "x-" + field.name;
    }
    const size_t length = in.Below(25);
    for (size_t i = 0; i < length; ++i) field.value.push_back(ValueChar(in.Byte()));
    fields.push_back(std::move(field));
  }
  if (const size_t fill = in.U16() % 10000; fill > 0) {
    fields.push_back({"X-Fill", std::string(fill, 'f')});
  }
  const size_t expect = in.Below(4);
  static constexpr const char* kExpects[] = {"", "100-continue", "100-CONTINUE", "x-other"};
  if (expect > 0) fields.push_back({"Expect", kExpects[expect]});
  const size_t connection = in.Below(4);
  static constexpr const char* kConnections[] = {"", "close", "keep-alive", "foo, Close"};
  if (connection > 0) fields.push_back({"Connection", kConnections[connection]});

  // The body and its framing, fields kept together in the order written.
  std::string body = in.Text(64);
  body.append(in.U16() % 70000, 'b');
  static constexpr const char* kChunked[] = {"chunked", "Chunked", "CHUNKED"};
  static constexpr const char* kOtherCodings[] = {"gzip", "gzip, chunked", "chunked, gzip",
                                                  "identity"};
  const std::string chunked = kChunked[in.Below(3)];
  const std::string other_coding = kOtherCodings[in.Below(4)];
  const std::string length = std::to_string(body.size());
  std::vector<Field> framing;
  bool conflict = false, chunked_body = false, length_body = false, other_te = false;
  switch (in.Below(10)) {
    case 0:  // no body
      break;
    case 1:
      framing = {{"Content-Length", length}};
      length_body = true;
      break;
    case 2:
      framing = {{"Transfer-Encoding", chunked}};
      chunked_body = true;
      break;
    case 3:
      framing = {{"Transfer-Encoding", other_coding}};
      other_te = true;
      break;
    case 4:
      // A coding other than chunked, then a length: Beast frames by the
      // length (unless chunked came last); the server refuses the coding.
      framing = {{"Transfer-Encoding", other_coding}, {"Content-Length", length}};
      other_te = true;
      length_body = other_coding != "gzip, chunked";
      conflict = !length_body;
      break;
    case 5:
      framing = {{"Content-Length", length}, {"Transfer-Encoding", chunked}};
      conflict = true;
      break;
    case 6:
      framing = {{"Transfer-Encoding", chunked}, {"Content-Length", length}};
      conflict = true;
      break;
    case 7:
      framing = {{"Content-Length", length}, {"Content-Length", length + "1"}};
      conflict = true;
      break;
    case 8:
      framing = {{"Content-Length", length}, {"content-length", length + ", " + length}};
      length_body = true;
      break;
    default:
      framing = {{"Content-Length", length}, {"Transfer-Encoding", other_coding}};
      conflict = true;
      break;
  }
  fields.insert(fields.begin() + static_cast<ptrdiff_t>(in.Below(fields.size() + 1)),
                framing.begin(), framing.end());

  std::string head = absl::StrCat(method, " ", target, http11 ? " HTTP/1.1\r\n" : " HTTP/1.0\r\n");
  for (const Field& field : fields) absl::StrAppend(&head, field.name, ": ", field.value, "\r\n");
  head += "\r\n";
  out->append(head);

  // The chunks: pieces of the body, each size line with an extension
  // (none, short, or longer than the connection's buffer), then the last
  // chunk and the trailer fields (none, one, or one past the buffer).
  std::vector<Field> trailers;
  bool long_line = false;
  int64_t chunk_sum = 0;
  bool over_limit_in_chunks = false;
  if (chunked_body) {
    auto extension = [&] {
      switch (in.Below(4)) {
        case 0:
          return std::string();
        case 1:
          return std::string(";a=b");
        case 2:
          return std::string(";name;q=\"quoted ext\"");
        default:
          return ";e" + std::string(70000, 'e');
      }
    };
    std::string chunks;
    size_t at = 0;
    while (at < body.size()) {
      const uint8_t pick = in.Byte();
      const size_t size = std::min(body.size() - at, pick == 0 ? body.size() : size_t{pick});
      const std::string ext = extension();
      if (ext.size() > kMaxBufferedBytes) long_line = long_line || !over_limit_in_chunks;
      chunk_sum += static_cast<int64_t>(size);
      if (!long_line && chunk_sum > max_body_bytes) over_limit_in_chunks = true;
      std::string size_text = absl::StrCat(absl::Hex(size));
      if (in.Byte() & 1) size_text = absl::AsciiStrToUpper(size_text);
      size_text.insert(0, in.Below(3), '0');
      absl::StrAppend(&chunks, size_text, ext, "\r\n", body.substr(at, size), "\r\n");
      at += size;
    }
    const std::string last_ext = extension();
    absl::StrAppend(&chunks, "0", last_ext, "\r\n");
    bool long_trailer = last_ext.size() > kMaxBufferedBytes;
    switch (in.Below(3)) {
      case 0:
        break;
      case 1:
        trailers.push_back({"X-Trailer", in.Text(20, kTokenChars)});
        break;
      default:
        trailers.push_back({"X-Trailer", std::string(70000, 't')});
        long_trailer = true;
        break;
    }
    for (const Field& field : trailers) {
      absl::StrAppend(&chunks, field.name, ": ", field.value, "\r\n");
    }
    chunks += "\r\n";
    if (!long_line && !over_limit_in_chunks && long_trailer) long_line = true;
    out->append(chunks);
  } else if (length_body || other_te || conflict) {
    out->append(body);
  }

  // The prediction, in the order the server checks.
  if (conflict) {
    p.status = 400;
    if (head.size() > kMaxHeadBytes) p.other_status = 431;
    return p;
  }
  if (head.size() > kMaxHeadBytes) {
    p.status = 431;
  } else if (length_body && static_cast<int64_t>(body.size()) > max_body_bytes) {
    p.status = 413;
  } else if (http11 && !has_host) {
    p.status = 400;
  } else if (other_te) {
    p.status = 501;
  } else if (http11 && expect == 3) {
    p.status = 417;
  } else if (chunked_body && long_line) {
    p.status = 400;
  } else if (chunked_body && over_limit_in_chunks) {
    p.status = 413;
  }
  if (p.status != 0) return p;
  p.request.method = method;
  p.request.target = served;
  // Beast keeps the fields in the order sent, except that a field goes after
  // the last one of its name (trailer fields too).
  for (const std::vector<Field>* list : {&fields, &trailers}) {
    for (const Field& field : *list) {
      auto& headers = p.request.headers;
      const std::string name = absl::AsciiStrToLower(field.name);
      auto at = headers.end();
      for (auto it = headers.begin(); it != headers.end(); ++it) {
        if (it->first == name) at = it + 1;
      }
      headers.emplace(at, name, TrimOws(field.value));
    }
  }
  if (length_body || chunked_body) p.request.body = body;
  p.keep_alive = http11 ? connection != 1 && connection != 3 : connection == 2;
  return p;
}

void CheckStructured(Reader& in, size_t piece, int64_t max_body_bytes) {
  std::string bytes;
  std::vector<Prediction> predictions;
  const size_t requests = in.Below(3) + 1;
  for (size_t i = 0; i < requests; ++i) {
    predictions.push_back(WriteRequest(in, max_body_bytes, &bytes));
  }
  MemoryStream stream(bytes, piece);
  const std::vector<Step> steps = Serve(&stream, max_body_bytes);
  for (size_t i = 0; i < steps.size(); ++i) {
    const Step& step = steps[i];
    if (i == predictions.size()) {
      // Every request read and kept alive: the connection ends unanswered.
      FUZZ_CHECK(step.outcome.kind == ReadOutcome::kClose && stream.exhausted());
      FUZZ_CHECK(i + 1 == steps.size());
      return;
    }
    const Prediction& p = predictions[i];
    if (p.status != 0) {
      if (step.outcome.kind != ReadOutcome::kAnswer) {
        std::fprintf(stderr, "request %zu: predicted %d, got kind %d\n", i, p.status,
                     static_cast<int>(step.outcome.kind));
      } else if (step.outcome.status != p.status && step.outcome.status != p.other_status) {
        std::fprintf(stderr, "request %zu: predicted %d, got %d (%s)\n", i, p.status,
                     step.outcome.status, step.outcome.message.c_str());
      }
      FUZZ_CHECK(step.outcome.kind == ReadOutcome::kAnswer);
      FUZZ_CHECK(step.outcome.status == p.status || step.outcome.status == p.other_status);
      FUZZ_CHECK(i + 1 == steps.size());
      return;
    }
    if (step.outcome.kind != ReadOutcome::kGoOn) {
      std::fprintf(stderr, "request %zu: predicted acceptance, got %d (%s)\n", i,
                   step.outcome.status, step.outcome.message.c_str());
    }
    FUZZ_CHECK(step.outcome.kind == ReadOutcome::kGoOn);
    FUZZ_CHECK(step.request.method == p.request.method);
    FUZZ_CHECK(step.request.target == p.request.target);
    if (step.request.headers != p.request.headers) {
      for (const auto& [name, value] : step.request.headers) {
        std::fprintf(stderr, "got  [%s] [%s]\n", name.c_str(), value.c_str());
      }
      for (const auto& [name, value] : p.request.headers) {
        std::fprintf(stderr, "want [%s] [%s]\n", name.c_str(), value.c_str());
      }
    }
    FUZZ_CHECK(step.request.headers == p.request.headers);
    FUZZ_CHECK(step.request.body == p.request.body);
    FUZZ_CHECK(step.keep_alive == p.keep_alive);
    if (!p.keep_alive) {
      FUZZ_CHECK(i + 1 == steps.size());
      return;
    }
  }
  FUZZ_CHECK(false);  // the last step ends the connection
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  const size_t piece = PieceSize(data[1]);
  const int64_t max_body_bytes = kBodyLimits[data[2] % std::size(kBodyLimits)];
  if (data[0] % 2 == 0) {
    const std::string bytes = Expand(data + 3, size - 3);
    MemoryStream stream(bytes, piece);
    CheckRaw(Serve(&stream, max_body_bytes), stream, max_body_bytes);
  } else {
    Reader in(data + 3, size - 3);
    CheckStructured(in, piece, max_body_bytes);
  }
  return 0;
}
