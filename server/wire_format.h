// Request parsing and response serialization for the Generation service's
// methods, which it handles as raw gRPC byte buffers. Parsing them ourselves
// lets a malformed request be INVALID_ARGUMENT, and a string field with
// invalid UTF-8 one that names the field, instead of a generic
// deserialization failure from inside gRPC.
#ifndef SWITCHSERVE_SERVER_WIRE_FORMAT_H_
#define SWITCHSERVE_SERVER_WIRE_FORMAT_H_

#include <string>

#include "absl/status/status.h"
#include "google/protobuf/message.h"
#include "grpcpp/support/byte_buffer.h"

namespace switchserve {

// Parses `buffer` into `message`. INVALID_ARGUMENT "text: is not valid UTF-8"
// (the field's path, e.g. "sampling.stop") or "malformed <type> message".
absl::Status ParseMessage(const grpc::ByteBuffer& buffer, google::protobuf::Message* message);

// The path of the first string field of `bytes` (a serialized message of
// `type`) whose value is not valid UTF-8, or "" when there is none.
std::string FindInvalidUtf8Field(const std::string& bytes,
                                 const google::protobuf::Descriptor& type);

grpc::ByteBuffer SerializeMessage(const google::protobuf::Message& message);

// `message` serialized, followed by `more_fields`: fields of its type already
// serialized (repeated fields' entries are appended to those in `message`).
grpc::ByteBuffer SerializeMessage(const google::protobuf::Message& message,
                                  const std::string& more_fields);

}  // namespace switchserve

#endif  // SWITCHSERVE_SERVER_WIRE_FORMAT_H_
