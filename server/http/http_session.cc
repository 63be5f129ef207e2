#include "server/http/http_session.h"

#include <poll.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/byte_budget.h"
#include "server/http/http_exchange.h"
#include "server/http/http_request_reading.h"
#include "server/http/http_server.h"
#include "server/http/http_server_state.h"

namespace switchserve {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
namespace ssl = net::ssl;
using tcp = net::ip::tcp;
using SteadyClock = std::chrono::steady_clock;

using http_reading::kMaxBufferedBytes;
using http_reading::ReadOutcome;

// The most a connection reads into its buffer at a time outside Beast's own
// reads (the empty lines before a head, bytes that arrive early).
constexpr size_t kReadBytes = 16 * 1024;
// How often a stream with more than --max-stream-buffer-bytes unread looks
// whether its client still reads.
constexpr std::chrono::milliseconds kReadingCheckInterval{10};

std::chrono::milliseconds Milliseconds(double seconds) {
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0));
}

template <class Stream>
class Session : public SessionBase, public std::enable_shared_from_this<Session<Stream>> {
 public:
  static constexpr bool kTls = !std::is_same_v<Stream, beast::tcp_stream>;

  Session(HttpServerState* state, Stream stream, std::string peer)
      : state_(state),
        stream_(std::move(stream)),
        peer_(std::move(peer)),
        stream_reservation_(state->options.output_budget) {}
  ~Session() override {
    std::lock_guard<std::mutex> lock(state_->mu);
    --state_->live_sessions;
    state_->sessions_changed.notify_all();
  }

  void Run() {
    beast::error_code ec;
    Lowest().socket().non_blocking(true, ec);  // for the peek in OnReadable
    // Stream events are small writes: without this, Nagle's algorithm holds
    // each one back until the client's (delayed) ACK of the previous one.
    Lowest().socket().set_option(tcp::no_delay(true), ec);
    if constexpr (kTls) {
      Lowest().expires_after(Milliseconds(state_->options.idle_timeout_s));
      stream_.async_handshake(ssl::stream_base::server,
                              [self = this->shared_from_this()](beast::error_code error) {
                                if (error) return self->Close();
                                self->ReadRequest();
                              });
    } else {
      net::dispatch(stream_.get_executor(),
                    [self = this->shared_from_this()] { self->ReadRequest(); });
    }
  }

  void Send(OutPiece piece) override {
    net::post(stream_.get_executor(),
              [self = this->shared_from_this(), piece = std::move(piece)]() mutable {
                if (self->closed_ || self->exchange_ == nullptr || self->forced_shutdown_) return;
                if (piece.render) {
                  piece.data = std::exchange(piece.render, nullptr)();
                  if (piece.data.empty()) return;
                }
                if (piece.kind == OutPiece::kChunk && !self->HoldUnread(piece.data.size())) return;
                self->pending_.push_back(std::move(piece));
                self->WriteNext();
              });
  }

  void Shutdown(bool force) override {
    // The pieces already queued before the forced close are dropped as they
    // come up, not made and written: thousands of a stream's may wait here
    // behind a write its client holds, and the close must not wait for them.
    if (force) forced_shutdown_ = true;
    net::post(stream_.get_executor(), [self = this->shared_from_this(), force] {
      if (self->exchange_ == nullptr) return self->Close();
      // A response still being written when the server stops: its exchange
      // is told (a stream whose prompts all finished is logged UNAVAILABLE,
      // 503, as its client never gets its end), and the connection closes.
      if (force) {
        self->EndResponse(
            absl::UnavailableError("the server stopped before the response was written"));
      }
    });
  }

 private:
  beast::tcp_stream& Lowest() { return beast::get_lowest_layer(stream_); }

  void ReadRequest() {
    if (closed_) return;
    if (state_->stopping) return Close();
    parser_.emplace();
    head_only_ = false;
    http10_ = false;
    cors_origin_.clear();
    preflight_ = false;
    http_reading::SetLimits(state_->options.max_body_bytes, &*parser_);
    body_reservation_ = ByteReservation(state_->body_budget);
    // One deadline for the empty lines, the head and the body.
    Lowest().expires_after(Milliseconds(state_->options.idle_timeout_s));
    ReadHead();
  }

  // RFC 9112 2.2: empty lines before the request line (a CRLF a client sent
  // after its previous request's body) are skipped; Beast's parser would
  // take them for a malformed request line.
  void ReadHead() {
    const auto buffered = buffer_.data();
    buffer_.consume(http_reading::EmptyLineBytes(
        std::string_view(static_cast<const char*>(buffered.data()), buffered.size())));
    if (buffer_.size() == 0) {
      stream_.async_read_some(buffer_.prepare(kReadBytes),
                              [self = this->shared_from_this()](beast::error_code ec, size_t n) {
                                if (ec)
                                  return self->Close();  // closed, reset or idle past the deadline
                                self->buffer_.commit(n);
                                self->ReadHead();
                              });
      return;
    }
    http::async_read_header(
        stream_, buffer_, *parser_,
        [self = this->shared_from_this()](beast::error_code ec, size_t head_bytes) {
          self->OnHeader(ec, head_bytes);
        });
  }

  void OnHeader(beast::error_code ec, size_t head_bytes) {
    if (const ReadOutcome outcome =
            http_reading::AfterHeadRead(ec, head_bytes, *parser_, state_->options.max_body_bytes);
        outcome.kind != ReadOutcome::kGoOn) {
      return Follow(outcome);
    }
    head_only_ = parser_->get().method() == http::verb::head;
    http10_ = parser_->get().version() < 11;
    const auto& head = parser_->get();
    if (const auto origin = head.find(http::field::origin); origin != head.end()) {
      cors_origin_ =
          state_->CorsOrigin(std::string_view(origin->value().data(), origin->value().size()));
    }
    preflight_ = !cors_origin_.empty() && head.method() == http::verb::options &&
                 head.find(http::field::access_control_request_method) != head.end();
    if (state_->options.check_head && !preflight_) {
      if (std::optional<HttpResponse> refusal =
              state_->options.check_head(RequestOf(parser_->get()));
          refusal) {
        return SendAndClose(std::move(*refusal));
      }
    }
    bool send_continue = false;
    if (const ReadOutcome outcome = http_reading::CheckExpectation(*parser_, &send_continue);
        outcome.kind != ReadOutcome::kGoOn) {
      return Follow(outcome);
    }
    // A declared body takes its share of the budget before it is read (the
    // parser reserves its whole length at the body's first byte); a chunked
    // one as it grows (ReadChunkedBody).
    if (const auto length = parser_->content_length();
        length && !body_reservation_.GrowTo(static_cast<int64_t>(*length))) {
      return Follow(http_reading::BodyBudgetExhausted(*state_->body_budget));
    }
    if (!send_continue) return ReadBody();
    // curl sends `Expect: 100-continue` with larger bodies and waits for it.
    auto go_on = std::make_shared<http::response<http::empty_body>>(http::status::continue_,
                                                                    parser_->get().version());
    http::async_write(stream_, *go_on,
                      [self = this->shared_from_this(), go_on](beast::error_code error, size_t) {
                        if (error) return self->Close();
                        self->ReadBody();
                      });
  }

  void ReadBody() {
    if (parser_->chunked()) return ReadChunkedBody();
    http::async_read(
        stream_, buffer_, *parser_,
        [self = this->shared_from_this()](beast::error_code ec, size_t) { self->OnRequest(ec); });
  }

  // A chunked body in pieces, the budget taken for what its buffer holds
  // after each.
  void ReadChunkedBody() {
    if (parser_->is_done()) return OnRequest(beast::error_code());
    http::async_read_some(
        stream_, buffer_, *parser_,
        [self = this->shared_from_this()](beast::error_code ec, size_t) {
          if (ec) return self->OnRequest(ec);
          if (!self->body_reservation_.GrowTo(
                  static_cast<int64_t>(self->parser_->get().body().capacity()))) {
            return self->Follow(http_reading::BodyBudgetExhausted(*self->state_->body_budget));
          }
          self->ReadChunkedBody();
        });
  }

  // An answer the server gives itself (then it closes), or the close.
  void Follow(const ReadOutcome& outcome) {
    if (outcome.kind == ReadOutcome::kAnswer) {
      return RespondAndClose(outcome.head_read, outcome.status, outcome.message,
                             outcome.retry_after_s);
    }
    Close();
  }

  HttpRequest RequestOf(const http::request<http::string_body>& message) const {
    return http_reading::RequestOf(message, peer_);
  }

  void OnRequest(beast::error_code ec) {
    if (const ReadOutcome outcome =
            http_reading::AfterBodyRead(ec, *parser_, state_->options.max_body_bytes);
        outcome.kind != ReadOutcome::kGoOn) {
      return Follow(outcome);
    }
    Lowest().expires_never();
    http::request<http::string_body> message = parser_->release();
    HttpRequest request = RequestOf(message);
    request.body = std::move(message.body());
    const double max_age_s = state_->options.max_connection_age_s;
    keep_alive_ = message.keep_alive() && !state_->stopping &&
                  (max_age_s <= 0 || SteadyClock::now() - opened_ < Milliseconds(max_age_s));
    exchange_ = std::make_shared<SessionExchange>(std::move(request), this->weak_from_this(),
                                                  std::move(body_reservation_));
    // The exchange's handler holds it, not the connection: this keeps the
    // connection until the response is written or the connection closes.
    answering_ = this->shared_from_this();
    WatchForDisconnect();
    if (preflight_) return exchange_->Respond(Preflight(exchange_->request()));
    state_->handler(exchange_);
  }

  // The answer to a CORS preflight from an allowed origin: any of the API's
  // methods, the headers the browser asks for (or the API's), for 10 min.
  static HttpResponse Preflight(const HttpRequest& request) {
    HttpResponse response;
    response.status = 204;
    response.content_type = "text/plain";
    response.headers = {{"access-control-allow-methods", "GET, POST, OPTIONS"},
                        {"access-control-allow-headers",
                         std::string(request.Header("access-control-request-headers")
                                         .value_or("authorization, content-type, x-request-id"))},
                        {"access-control-max-age", "600"}};
    return response;
  }

  // Answers without the handler (malformed request, body too large); the
  // request's head goes to on_own_error if it was read whole.
  void RespondAndClose(bool head_read, int status, const std::string& message, int retry_after_s) {
    HttpResponse response;
    response.status = status;
    response.body = state_->ErrorBody(status, message);
    if (retry_after_s > 0)
      response.headers.emplace_back("retry-after", absl::StrCat(retry_after_s));
    if (head_read && state_->options.on_own_error) {
      state_->options.on_own_error(RequestOf(parser_->get()), &response);
    }
    SendAndClose(std::move(response));
  }

  // Answers `response` and closes the connection (its request's body, if
  // any, unread).
  void SendAndClose(HttpResponse response) {
    keep_alive_ = false;
    exchange_ = std::make_shared<SessionExchange>(HttpRequest{}, this->weak_from_this());
    pending_.emplace_back(OutPiece::kFull, std::move(response), std::string());
    WriteNext();
  }

  // While a response is pending the socket is watched: its end (or a TLS
  // alert) means the client closed. Bytes that arrive early (the next,
  // pipelined request, or an empty line) are set aside in the buffer, read
  // as the next request once the response is written; past the buffer's
  // size, or over TLS (whose records are read only through the stream),
  // watching stops and a failed write still notices a disconnect.
  void WatchForDisconnect() {
    Lowest().socket().async_wait(tcp::socket::wait_read,
                                 [self = this->shared_from_this(), generation = watch_generation_](
                                     beast::error_code ec) { self->OnReadable(ec, generation); });
  }

  void OnReadable(beast::error_code ec, uint64_t generation) {
    if (generation != watch_generation_ || closed_ || exchange_ == nullptr) return;
    if (ec) return ClientGone();
    unsigned char first = 0;
    beast::error_code peek_error;
    const size_t n =
        Lowest().socket().receive(net::buffer(&first, 1), tcp::socket::message_peek, peek_error);
    if (peek_error == net::error::would_block || peek_error == net::error::try_again) {
      return WatchForDisconnect();
    }
    constexpr unsigned char kTlsAlertRecord = 0x15;  // e.g. close_notify
    if (peek_error || n == 0 || (kTls && first == kTlsAlertRecord)) return ClientGone();
    if constexpr (!kTls) {
      const size_t room = buffer_.max_size() - buffer_.size();
      if (room == 0) return;
      beast::error_code read_error;
      const size_t read =
          Lowest().socket().receive(buffer_.prepare(std::min(room, kReadBytes)), 0, read_error);
      buffer_.commit(read);
      if (read_error && read_error != net::error::would_block &&
          read_error != net::error::try_again) {
        return ClientGone();
      }
      WatchForDisconnect();
    }
  }

  void ClientGone() { EndResponse(absl::CancelledError("the client went away")); }

  // The response cannot be completed, for `why`: its exchange is told, and
  // the connection closes.
  void EndResponse(absl::Status why) {
    if (exchange_ != nullptr) {
      std::shared_ptr<SessionExchange> exchange = exchange_;
      exchange->MarkGone(std::move(why));
    }
    Close();
  }

  // Counts `bytes` more of a streamed response's data as unread (queued or
  // being written): false, the response ended RESOURCE_EXHAUSTED, when that
  // passes the stream's limit while its client is not reading
  // (EndIfNotReading), or does not fit in the budget all streams share.
  bool HoldUnread(size_t bytes) {
    const HttpServerOptions& options = state_->options;
    const int64_t unread = unread_stream_bytes_ + static_cast<int64_t>(bytes);
    if (unread > options.max_stream_buffer_bytes && !EndIfNotReading()) return false;
    if (!stream_reservation_.GrowTo(unread)) {
      EndResponse(absl::ResourceExhaustedError(OutputBudgetFullMessage(*options.output_budget)));
      return false;
    }
    unread_stream_bytes_ = unread;
    return true;
  }

  // With more than the stream's limit unread: ends the response (false) if
  // its client is not reading, that is, if the socket's send buffer is full.
  // Otherwise the data waits for this thread, not for the client: a stream
  // of many prompts makes an event for each at every engine step, all
  // handed to this thread at once, and they queue behind the write in
  // flight however fast the client reads (on a small machine this thread,
  // below the engine's priority, can fall well behind the engine). Then it
  // looks again shortly, for as long as that much stays unread.
  bool EndIfNotReading() {
    pollfd writable{};
    writable.fd = Lowest().socket().native_handle();
    writable.events = POLLOUT;
    if (::poll(&writable, 1, 0) == 1 && (writable.revents & POLLOUT) != 0 &&
        (writable.revents & (POLLERR | POLLHUP)) == 0) {
      LookAgainIfNotReading();
      return true;
    }
    EndResponse(absl::ResourceExhaustedError(
        StreamOutputPastLimitMessage(state_->options.max_stream_buffer_bytes)));
    return false;
  }

  void LookAgainIfNotReading() {
    if (reading_check_armed_) return;
    reading_check_armed_ = true;
    reading_check_.expires_after(kReadingCheckInterval);
    reading_check_.async_wait(
        [self = this->shared_from_this(), generation = watch_generation_](beast::error_code ec) {
          self->reading_check_armed_ = false;
          if (ec || self->closed_ || self->exchange_ == nullptr ||
              generation != self->watch_generation_) {
            return;
          }
          if (self->unread_stream_bytes_ > self->state_->options.max_stream_buffer_bytes) {
            self->EndIfNotReading();
          }
        });
  }

  void ReleaseUnread(int64_t bytes) {
    unread_stream_bytes_ -= bytes;
    stream_reservation_.ShrinkTo(unread_stream_bytes_);
  }

  template <class Body>
  void SetHead(const HttpResponse& from, http::response<Body>* to) const {
    to->version(11);
    to->result(static_cast<unsigned>(from.status));
    to->set(http::field::server, "switchserve");
    to->set(http::field::content_type, from.content_type);
    for (const auto& [name, value] : from.headers) to->set(name, value);
    if (!cors_origin_.empty()) {
      to->set(http::field::access_control_allow_origin, cors_origin_);
      to->set(http::field::access_control_expose_headers, "x-request-id");
      if (cors_origin_ != "*") to->set(http::field::vary, "Origin");
    }
    to->keep_alive(keep_alive_);
  }

  void WriteNext() {
    while (!writing_ && !closed_ && !pending_.empty() &&
           pending_.front().kind == OutPiece::kWritten) {
      std::function<void()> written = std::move(pending_.front().written);
      pending_.pop_front();
      written();
    }
    if (writing_ || closed_ || pending_.empty()) return;
    OutPiece piece = std::move(pending_.front());
    pending_.pop_front();
    writing_ = true;
    Lowest().expires_after(Milliseconds(state_->options.idle_timeout_s));
    auto done = [self = this->shared_from_this(),
                 last = piece.kind == OutPiece::kFull || piece.kind == OutPiece::kEnd](
                    beast::error_code ec, size_t) { self->OnWritten(ec, last); };
    switch (piece.kind) {
      case OutPiece::kFull:
        full_.emplace();
        SetHead(piece.response, &*full_);
        full_->body() = std::move(piece.response.body);
        full_held_ = std::move(piece.response.held);
        full_->prepare_payload();
        // A 204 has no body and no Content-Length (RFC 9110 8.6), which
        // prepare_payload sets to 0.
        if (full_->result() == http::status::no_content) full_->erase(http::field::content_length);
        if (head_only_) {
          // HEAD: the headers GET would get, Content-Length included, and
          // no body (one would be read as the next response).
          full_serializer_.emplace(*full_);
          http::async_write_header(stream_, *full_serializer_, std::move(done));
          return;
        }
        http::async_write(stream_, *full_, std::move(done));
        return;
      case OutPiece::kHead:
        // An HTTP/1.0 client cannot read chunks (RFC 9112 6.1): its stream
        // is the body until the connection closes.
        if (http10_) keep_alive_ = false;
        head_.emplace();
        SetHead(piece.response, &*head_);
        head_->chunked(!http10_);
        head_serializer_.emplace(*head_);
        http::async_write_header(stream_, *head_serializer_, std::move(done));
        return;
      case OutPiece::kChunk:
        // Chunks queued while the previous write ran go out as one.
        chunk_ = std::move(piece.data);
        while (!pending_.empty() && pending_.front().kind == OutPiece::kChunk) {
          chunk_ += pending_.front().data;
          pending_.pop_front();
        }
        writing_chunk_bytes_ = static_cast<int64_t>(chunk_.size());
        if (http10_) {
          net::async_write(stream_, net::buffer(chunk_), std::move(done));
        } else {
          net::async_write(stream_, http::make_chunk(net::buffer(chunk_)), std::move(done));
        }
        return;
      case OutPiece::kEnd:
        if (http10_) {
          net::post(stream_.get_executor(),
                    [done = std::move(done)]() mutable { done(beast::error_code(), 0); });
        } else {
          net::async_write(stream_, http::make_chunk_last(), std::move(done));
        }
        return;
      case OutPiece::kWritten:  // run before a write starts (above), never written
        writing_ = false;
        return;
    }
  }

  void OnWritten(beast::error_code ec, bool last) {
    writing_ = false;
    ReleaseUnread(std::exchange(writing_chunk_bytes_, 0));
    if (closed_) return;
    Lowest().expires_never();
    if (ec) return ClientGone();
    if (!last) return WriteNext();
    // The response is complete.
    exchange_->MarkComplete();
    exchange_.reset();
    const std::shared_ptr<Session> answering = std::move(answering_);
    pending_.clear();
    ++watch_generation_;
    beast::error_code ignored;
    Lowest().socket().cancel(ignored);  // the disconnect watch
    full_.reset();
    full_held_ = ByteReservation();
    head_serializer_.reset();
    head_.reset();
    if (!keep_alive_) return Close();
    ReadRequest();
  }

  void Close() {
    if (closed_) return;
    closed_ = true;
    pending_.clear();
    reading_check_.cancel();
    ReleaseUnread(unread_stream_bytes_ - writing_chunk_bytes_);  // what a write holds: its end
    beast::error_code ignored;
    Lowest().socket().shutdown(tcp::socket::shutdown_both, ignored);
    Lowest().close();
    const std::shared_ptr<Session> answering = std::move(answering_);
  }

  HttpServerState* const state_;
  Stream stream_;
  const std::string peer_;
  const SteadyClock::time_point opened_ = SteadyClock::now();
  // Bounded: a request's head is limited by the parser (kMaxHeadBytes) and
  // its body by --max-request-bytes, but the lines between (a chunk's size
  // and extensions, the trailer fields) only by this buffer, which the
  // parser fills until it finds their end.
  beast::flat_buffer buffer_{kMaxBufferedBytes};
  std::optional<http::request_parser<http::string_body>> parser_;
  // The budget the body being read holds (moved to its exchange).
  ByteReservation body_reservation_;
  std::shared_ptr<SessionExchange> exchange_;  // the request being answered
  // Set while exchange_ is being answered and the connection open.
  std::shared_ptr<Session> answering_;
  bool keep_alive_ = false;
  bool closed_ = false;
  std::atomic<bool> forced_shutdown_{false};  // Shutdown(force) was called
  uint64_t watch_generation_ = 0;
  std::deque<OutPiece> pending_;
  bool writing_ = false;
  // A streamed response's data queued in pending_ or being written (of it,
  // writing_chunk_bytes_), and what that holds of the budget all streams
  // share (HoldUnread).
  int64_t unread_stream_bytes_ = 0;
  int64_t writing_chunk_bytes_ = 0;
  ByteReservation stream_reservation_;
  // Looks again whether the client reads while more than the stream's limit
  // is unread (LookAgainIfNotReading).
  net::steady_timer reading_check_{stream_.get_executor()};
  bool reading_check_armed_ = false;
  // What the write in flight reads from.
  std::optional<http::response<http::string_body>> full_;
  ByteReservation full_held_;  // what full_'s body holds of the output budget
  std::optional<http::response_serializer<http::string_body>> full_serializer_;
  bool head_only_ = false;  // the request being answered is a HEAD
  bool http10_ = false;     // ... comes from an HTTP/1.0 client
  // ... comes from an allowed CORS origin: its Access-Control-Allow-Origin
  // (HttpServerState::CorsOrigin); empty: none.
  std::string cors_origin_;
  bool preflight_ = false;  // ... is that origin's CORS preflight
  std::optional<http::response<http::empty_body>> head_;
  std::optional<http::response_serializer<http::empty_body>> head_serializer_;
  std::string chunk_;
};

}  // namespace

template <class Stream>
void StartSession(HttpServerState* state, Stream stream, std::string peer) {
  auto session = std::make_shared<Session<Stream>>(state, std::move(stream), std::move(peer));
  {
    std::lock_guard<std::mutex> lock(state->mu);
    state->sessions.remove_if([](const std::weak_ptr<SessionBase>& s) { return s.expired(); });
    state->sessions.push_back(session);
    ++state->live_sessions;
  }
  session->Run();
}

template void StartSession(HttpServerState* state, beast::tcp_stream stream, std::string peer);
template void StartSession(HttpServerState* state, beast::ssl_stream<beast::tcp_stream> stream,
                           std::string peer);

}  // namespace switchserve
