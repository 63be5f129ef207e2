// A small asynchronous HTTP/1.1 server for the OpenAI-compatible API:
// Boost.Beast over Boost.Asio, plaintext or TLS (the gRPC side's certificate,
// key and client CA). A few I/O threads serve every connection; handlers run
// on them and must not block: they hand work on (to the engine) and answer
// later from any thread through the HttpExchange.
//
// Connections are HTTP/1.1 keep-alive, with pipelining: requests are
// answered in order, one at a time. A request body larger than
// max_body_bytes is answered 413; a malformed request 400; both close the
// connection. While a response is pending the server watches the socket, so a
// client that disconnects is noticed at once (HttpExchange::OnClientGone),
// not only at the next write. A streamed response's client that does not
// read is left only so much written data (HttpServerOptions).
#ifndef SWITCHSERVE_SERVER_HTTP_HTTP_SERVER_H_
#define SWITCHSERVE_SERVER_HTTP_HTTP_SERVER_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/byte_budget.h"
#include "server/http/http_request.h"
#include "server/server_flags.h"

namespace switchserve {

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::vector<std::pair<std::string, std::string>> headers;  // extra headers
  std::string body;                                          // ignored for StartStream
  // Respond: what the body holds of a budget (the output waiting for
  // clients), given back once it is written or the connection closes.
  ByteReservation held{};
};

// One request being answered. The handler (or whoever it hands the exchange
// to) answers exactly once: Respond(), or StartStream(), any number of
// Write()s and End(). These methods may be called from any thread, return at
// once and are carried out in order on the connection; after the client is
// gone they do nothing. An exchange must not be used after HttpServer::Stop
// returned.
class HttpExchange {
 public:
  virtual ~HttpExchange() = default;
  virtual const HttpRequest& request() const = 0;

  virtual void Respond(HttpResponse response) = 0;
  // A chunked response (server-sent events): status and headers now, the
  // body as it is written.
  virtual void StartStream(HttpResponse head) = 0;
  virtual void Write(std::string data) = 0;
  // A Write whose data `render` makes on the connection's I/O thread, when
  // the pieces sent before it have been taken in: work (such as building
  // JSON) that the calling thread hands off. Not called once the client is
  // gone. An empty result writes nothing.
  virtual void WriteRendered(std::function<std::string()> render) = 0;
  // Runs `written` on the connection's I/O thread once everything sent
  // before it has been written to the socket (not necessarily read by the
  // client); never if the response cannot be completed (on_gone runs).
  virtual void WhenWritten(std::function<void()> written) = 0;
  virtual void End() = 0;

  // `on_gone` runs once, on an I/O thread, if the response cannot be
  // completed: the client disconnected or a write to it failed (`why`
  // CANCELLED), or a stream's client left more written data unread than
  // HttpServerOptions allow, and the server closed the connection (`why`
  // RESOURCE_EXHAUSTED, saying which limit). At once when that already
  // happened. Set it at most once.
  virtual void OnClientGone(std::function<void(const absl::Status& why)> on_gone) = 0;
};

using HttpHandler = std::function<void(std::shared_ptr<HttpExchange>)>;

struct HttpServerState;  // http_server_state.h

struct HttpServerOptions {
  std::string host;
  int port = 0;  // 0: a free port (port() says which)
  TlsOptions tls;
  int64_t max_body_bytes = 4 << 20;
  // The request bodies all connections together may hold, being read or
  // handed on (until their exchange is destroyed): a declared Content-Length
  // counts before the body is read, a chunked body as it arrives. A request
  // whose body does not fit is answered 429 with `Retry-After: 1`
  // (on_own_error is called) and its connection closes.
  int64_t max_buffered_body_bytes = int64_t{1} << 30;
  // A streamed response (StartStream) whose client does not read: the
  // written data it may hold waiting (rendered, not yet taken by the
  // socket), and the budget that data takes from, shared with every other
  // response waiting for its client (null: none; a unary response brings its
  // own reservation, HttpResponse::held). Past either the connection is
  // closed and the exchange's on_gone told why (RESOURCE_EXHAUSTED).
  int64_t max_stream_buffer_bytes = int64_t{4} << 20;
  std::shared_ptr<ByteBudget> output_budget;
  int threads = 2;
  // Keep-alive connections close after their first response past this age
  // (0: no limit), so clients reconnect and spread over new replicas.
  double max_connection_age_s = 0;
  // At most this many connections open at once; a connection past it is
  // closed as soon as it is accepted (its client sees the connection end and
  // may retry, here or at another replica). 0: half of the process's
  // open-file limit at the time of each accept, so that HTTP clients cannot
  // take every descriptor (gRPC 1.51's listener stops accepting for good
  // once it meets EMFILE).
  int64_t max_connections = 0;
  // Runs on an I/O thread for each connection closed for max_connections,
  // with the limit that applied.
  std::function<void(int64_t limit)> on_connection_refused;
  // A connection waiting this long for (the rest of) a request is closed;
  // also bounds each write to a client that stopped reading.
  double idle_timeout_s = 60;
  // The body of the error responses the server itself sends (400 for a
  // malformed request, 413 for a body over the limit). Default: the message.
  std::function<std::string(int status, const std::string& message)> error_body;
  // Called with the head of a request the server itself answers with an
  // error (400 for a malformed body, 413, 501), before the response goes
  // out: it may add headers (and count and log the request). Not called
  // when the head itself could not be read.
  std::function<void(const HttpRequest& head, HttpResponse* response)> on_own_error;
  // Called with a request's head (its body empty) before the body is read
  // (or `100 Continue` sent): a response to answer instead, after which the
  // connection closes; nullopt to go on. Lets a token check refuse a request
  // before its body is buffered.
  std::function<std::optional<HttpResponse>(const HttpRequest& head)> check_head;
  // CORS: origins ("https://app.example.com") whose browser pages may read
  // the answers, or "*" for any. A request from one (its Origin header)
  // gets Access-Control-Allow-Origin (and Expose-Headers: x-request-id) on
  // its response; its preflight (OPTIONS with
  // Access-Control-Request-Method) is answered 204 by the server itself,
  // before check_head and the handler (a preflight carries no token).
  // Empty: no CORS headers, and OPTIONS goes to the handler.
  std::vector<std::string> allowed_origins;
};

class HttpServer {
 public:
  // Binds, listens and starts the I/O threads. UNAVAILABLE when the address
  // cannot be bound, INVALID_ARGUMENT / NOT_FOUND for TLS files.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const HttpServerOptions& options,
                                                           HttpHandler handler);
  ~HttpServer();  // Stop(0)

  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  int port() const;

  // Stops accepting, closes idle connections, lets responses in progress
  // finish for up to `timeout`, then closes every connection and joins the
  // I/O threads. Idempotent.
  void Stop(std::chrono::milliseconds timeout);

 private:
  explicit HttpServer(std::unique_ptr<HttpServerState> state);
  std::unique_ptr<HttpServerState> state_;
};

}  // namespace switchserve

#endif  // SWITCHSERVE_SERVER_HTTP_HTTP_SERVER_H_
