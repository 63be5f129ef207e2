#include "server/wire_format.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/text/detokenizer.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"

namespace switchserve {
namespace {

using google::protobuf::FieldDescriptor;
using google::protobuf::internal::WireFormatLite;

std::string BufferToString(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!buffer.Dump(&slices).ok()) return out;
  for (const grpc::Slice& slice : slices) {
    out.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  return out;
}

// Walks the fields of one message; returns the path of an invalid string
// field, "" when all are valid or the bytes end early (malformed input is
// reported by the real parser).
std::string Walk(google::protobuf::io::CodedInputStream* in,
                 const google::protobuf::Descriptor& type, const std::string& prefix, int depth) {
  while (true) {
    const uint32_t tag = in->ReadTag();
    if (tag == 0) return "";
    const int number = WireFormatLite::GetTagFieldNumber(tag);
    const FieldDescriptor* field = type.FindFieldByNumber(number);
    const bool delimited =
        WireFormatLite::GetTagWireType(tag) == WireFormatLite::WIRETYPE_LENGTH_DELIMITED;
    if (field == nullptr || !delimited ||
        (field->type() != FieldDescriptor::TYPE_STRING &&
         field->type() != FieldDescriptor::TYPE_MESSAGE)) {
      if (!WireFormatLite::SkipField(in, tag)) return "";
      continue;
    }
    const std::string path = prefix + field->name();
    if (field->type() == FieldDescriptor::TYPE_STRING) {
      std::string value;
      if (!WireFormatLite::ReadBytes(in, &value)) return "";
      if (!IsValidUtf8(value)) return path;
      continue;
    }
    uint32_t length = 0;
    if (!in->ReadVarint32(&length) || depth > 16) return "";
    const auto limit = in->PushLimit(static_cast<int>(length));
    std::string found = Walk(in, *field->message_type(), path + ".", depth + 1);
    if (!found.empty()) return found;
    in->PopLimit(limit);
  }
}

}  // namespace

std::string FindInvalidUtf8Field(const std::string& bytes,
                                 const google::protobuf::Descriptor& type) {
  google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(bytes.data()),
                                            static_cast<int>(bytes.size()));
  return Walk(&in, type, "", 0);
}

absl::Status ParseMessage(const grpc::ByteBuffer& buffer, google::protobuf::Message* message) {
  const std::string bytes = BufferToString(buffer);
  if (message->ParseFromString(bytes)) return absl::OkStatus();
  const std::string field = FindInvalidUtf8Field(bytes, *message->GetDescriptor());
  if (!field.empty())
    return absl::InvalidArgumentError(absl::StrCat(field, ": is not valid UTF-8"));
  return absl::InvalidArgumentError(
      absl::StrCat("malformed ", message->GetDescriptor()->full_name(), " message"));
}

grpc::ByteBuffer SerializeMessage(const google::protobuf::Message& message) {
  grpc::Slice slice(message.SerializeAsString());
  return grpc::ByteBuffer(&slice, 1);
}

grpc::ByteBuffer SerializeMessage(const google::protobuf::Message& message,
                                  const std::string& more_fields) {
  if (more_fields.empty()) return SerializeMessage(message);
  grpc::Slice slices[] = {grpc::Slice(message.SerializeAsString()), grpc::Slice(more_fields)};
  return grpc::ByteBuffer(slices, 2);
}

}  // namespace switchserve
