// The reactors of the two generation calls. Each one submits its request to
// the engine and is completed by the engine's updates (through a
// GenerationSink); a client cancellation is forwarded to the engine, which
// then ends the request at its next step. A reactor deletes itself in OnDone,
// which gRPC calls only after Finish, which only the final update triggers, so
// the sink never outlives what it points to.
#ifndef SWITCHSERVE_SERVER_GENERATE_CALLS_H_
#define SWITCHSERVE_SERVER_GENERATE_CALLS_H_

#include <chrono>
#include <mutex>
#include <optional>

#include "engine/runtime/request.h"
#include "grpc/support/time.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/byte_buffer.h"
#include "switchserve/v1/generation.pb.h"

namespace switchserve {

class GenerationService;

// The running GenerateStream calls, for the periodic check (Sweep, on the
// service's WriteQueue thread) that ends a stream whose client stopped
// reading: one whose write has waited for it longer than the timeout.
//
// Thread-safe.
class StreamRegistry {
 public:
  // The registry's link in a Generate or GenerateStream call.
  class Member {
   public:
    // Ends the call (RESOURCE_EXHAUSTED, its request cancelled) if output of
    // it has waited for its client since before `started_before`. Called
    // under the registry's lock, on the sweeping (WriteQueue) thread.
    virtual void EndIfStalled(std::chrono::steady_clock::time_point started_before) = 0;

   protected:
    ~Member() = default;

   private:
    friend class StreamRegistry;
    Member* prev_ = nullptr;
    Member* next_ = nullptr;
  };

  void Add(Member* member);
  void Remove(Member* member);
  // Ends (RESOURCE_EXHAUSTED, its request cancelled) every call with output
  // waiting for its client for longer than `timeout`: a GenerateStream's
  // write, a Generate's response.
  void Sweep(std::chrono::steady_clock::duration timeout);

 private:
  std::mutex mu_;
  Member* head_ = nullptr;
};

// Starts a unary Generate call for an already validated request.
// `response` receives the serialized v1::GenerateResponse.
grpc::ServerUnaryReactor* StartUnaryGenerate(GenerationService* service,
                                             grpc::CallbackServerContext* context,
                                             GenerationRequest request, grpc::ByteBuffer* response);
// Starts a GenerateStream call for an already validated request; it writes
// serialized v1::GenerateStreamResponse messages.
grpc::ServerWriteReactor<grpc::ByteBuffer>* StartStreamingGenerate(
    GenerationService* service, grpc::CallbackServerContext* context, GenerationRequest request);

// Why gRPC cancelled a call (OnCancel): its deadline passed (or is less than
// 100 ms away: the client's own clock ends it first), or the client cancelled
// it or went away.
CancelCause CancelCauseOf(const grpc::CallbackServerContext& context);

// The time left before the call's deadline, read from gRPC's raw deadline
// (its time_point, context.deadline(), wraps past the year 2262); nullopt
// when the call has none. Negative once the deadline has passed.
std::optional<gpr_timespec> TimeToDeadline(const grpc::ServerContextBase& context);

// The status a call ends with when its request finished with kCancelled, as
// the client sees it: CANCELLED (the client's cancellation),
// DEADLINE_EXCEEDED (its deadline), UNAVAILABLE (the server shutting down).
grpc::Status CancelledCallStatus(CancelCause cause);

}  // namespace switchserve

#endif  // SWITCHSERVE_SERVER_GENERATE_CALLS_H_
