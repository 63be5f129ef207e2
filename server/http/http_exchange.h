// Internal to server/http: what a connection is asked to send (OutPiece), and
// the HttpExchange a session hands to the handler for each request
// (SessionExchange), whose writes become OutPieces on the session.
#ifndef SWITCHSERVE_SERVER_HTTP_HTTP_EXCHANGE_H_
#define SWITCHSERVE_SERVER_HTTP_HTTP_EXCHANGE_H_

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "server/byte_budget.h"
#include "server/http/http_request.h"
#include "server/http/http_server.h"
#include "server/http/http_session.h"

namespace switchserve {

// What a connection is asked to send, in order.
struct OutPiece {
  enum Kind { kFull, kHead, kChunk, kEnd, kWritten };
  OutPiece(Kind k, HttpResponse r, std::string d, std::function<std::string()> f = nullptr)
      : kind(k), response(std::move(r)), data(std::move(d)), render(std::move(f)) {}
  explicit OutPiece(std::function<void()> w) : kind(kWritten), written(std::move(w)) {}
  Kind kind;
  HttpResponse response;  // kFull, kHead
  std::string data;       // kChunk
  // kChunk: set, it makes `data` on the connection's strand as the piece
  // arrives there.
  std::function<std::string()> render;
  // kWritten: run when the pieces before it have been written.
  std::function<void()> written;
};

// The exchange a session hands to the handler for each request: its writes
// become OutPieces queued on the session, which it reaches as long as the
// connection lives.
class SessionExchange : public HttpExchange {
 public:
  SessionExchange(HttpRequest request, std::weak_ptr<SessionBase> session,
                  ByteReservation body = ByteReservation())
      : request_(std::move(request)), session_(std::move(session)), body_(std::move(body)) {}

  const HttpRequest& request() const override { return request_; }
  void Respond(HttpResponse response) override {
    Send(OutPiece(OutPiece::kFull, std::move(response), {}));
  }
  void StartStream(HttpResponse head) override {
    Send(OutPiece(OutPiece::kHead, std::move(head), {}));
  }
  void Write(std::string data) override {
    if (!data.empty()) Send(OutPiece(OutPiece::kChunk, {}, std::move(data)));
  }
  void WriteRendered(std::function<std::string()> render) override {
    Send(OutPiece(OutPiece::kChunk, {}, {}, std::move(render)));
  }
  void WhenWritten(std::function<void()> written) override { Send(OutPiece(std::move(written))); }
  void End() override { Send(OutPiece(OutPiece::kEnd, {}, {})); }
  void OnClientGone(std::function<void(const absl::Status& why)> on_gone) override {
    absl::Status why;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!gone_) {
        on_gone_ = std::move(on_gone);
        return;
      }
      why = why_;
    }
    on_gone(why);
  }

  // The connection's side, on its strand: the response cannot be completed,
  // for `why`.
  void MarkGone(absl::Status why) {
    std::function<void(const absl::Status&)> on_gone;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (gone_ || complete_) return;
      gone_ = true;
      why_ = why;
      on_gone.swap(on_gone_);
    }
    if (on_gone) on_gone(why);
  }
  void MarkComplete() {
    std::lock_guard<std::mutex> lock(mu_);
    complete_ = true;
    on_gone_ = nullptr;
  }

 private:
  void Send(OutPiece piece) {
    if (auto session = session_.lock()) session->Send(std::move(piece));
  }

  const HttpRequest request_;
  const std::weak_ptr<SessionBase> session_;
  // The budget request_.body holds, given back with the exchange.
  const ByteReservation body_;
  std::mutex mu_;
  bool gone_ = false;
  absl::Status why_;  // once gone_
  bool complete_ = false;
  std::function<void(const absl::Status&)> on_gone_;
};

}  // namespace switchserve

#endif  // SWITCHSERVE_SERVER_HTTP_HTTP_EXCHANGE_H_
