#include "engine/text/tokenizer.h"

#include <array>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "engine/text/sentencepiece_model.h"

namespace switchserve {
namespace {

// Every byte value once, in order: a byte token's PieceBytes points into it.
constexpr std::array<char, 256> kBytes = [] {
  std::array<char, 256> bytes{};
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i);
  return bytes;
}();

class ByteTokenizer final : public Tokenizer {
 public:
  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text) const override {
    std::vector<int32_t> ids;
    ids.reserve(text.size());
    for (char c : text) ids.push_back(static_cast<unsigned char>(c));
    return ids;
  }

  absl::StatusOr<std::vector<int32_t>> EncodeSpans(std::string_view text,
                                                   std::vector<size_t>* ends) const override {
    if (ends != nullptr) {
      ends->resize(text.size());
      for (size_t i = 0; i < text.size(); ++i) (*ends)[i] = i + 1;
    }
    return Encode(text);
  }

  std::string Decode(absl::Span<const int32_t> ids) const override {
    std::string text;
    text.reserve(ids.size());
    for (int32_t id : ids) {
      if (id >= 0 && id < 256) text.push_back(static_cast<char>(static_cast<unsigned char>(id)));
    }
    return text;
  }

  std::string_view PieceBytes(int32_t id, bool /*first*/) const override {
    if (id < 0 || id >= 256) return {};
    return std::string_view(&kBytes[static_cast<size_t>(id)], 1);
  }

  std::string_view kind() const override { return "byte"; }
  int vocab_size() const override { return 256; }
};

class SentencePieceTokenizer final : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(std::unique_ptr<SentencePieceModel> model)
      : model_(std::move(model)) {}

  absl::StatusOr<std::vector<int32_t>> Encode(std::string_view text) const override {
    return EncodeSpans(text, nullptr);
  }

  absl::StatusOr<std::vector<int32_t>> EncodeSpans(std::string_view text,
                                                   std::vector<size_t>* ends) const override {
    absl::StatusOr<std::vector<int32_t>> ids = model_->Encode(text, ends);
    if (!ids.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("sentencepiece encode: ", ids.status().message()));
    }
    return ids;
  }

  // Ids the model does not know (the config's vocab_size may exceed the piece
  // count) are special and decode to nothing.
  std::string Decode(absl::Span<const int32_t> ids) const override { return model_->Decode(ids); }

  std::string_view PieceBytes(int32_t id, bool first) const override {
    return model_->PieceBytes(id, first);
  }

  std::string_view kind() const override { return "sentencepiece"; }
  int vocab_size() const override { return model_->PieceSize(); }

 private:
  std::unique_ptr<SentencePieceModel> model_;
};

}  // namespace

std::unique_ptr<Tokenizer> CreateByteTokenizer() { return std::make_unique<ByteTokenizer>(); }

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadSentencePieceTokenizer(
    const std::string& model_path) {
  std::error_code fs_error;
  if (!std::filesystem::exists(model_path, fs_error)) {
    return absl::NotFoundError(absl::StrCat(model_path, ": not found"));
  }
  if (!std::filesystem::is_regular_file(model_path, fs_error)) {
    return absl::InvalidArgumentError(absl::StrCat(model_path, ": not a regular file"));
  }
  // libsentencepiece aborts the process on a file of 2 GiB or more (a
  // 32-bit length); real models are a few MiB.
  constexpr uintmax_t kMaxModelBytes = uintmax_t{1} << 30;
  if (const uintmax_t size = std::filesystem::file_size(model_path, fs_error);
      !fs_error && size > kMaxModelBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        model_path, ": ", size, " bytes, more than the 1 GiB a SentencePiece model may have"));
  }
  absl::StatusOr<std::unique_ptr<SentencePieceModel>> model = SentencePieceModel::Load(model_path);
  if (!model.ok()) {
    if (!absl::IsInvalidArgument(model.status())) return model.status();
    return absl::InvalidArgumentError(
        absl::StrCat(model_path, ": not a valid SentencePiece model: ", model.status().message()));
  }
  if ((*model)->PieceSize() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(model_path, ": SentencePiece model has no pieces"));
  }
  return std::unique_ptr<Tokenizer>(new SentencePieceTokenizer(*std::move(model)));
}

}  // namespace switchserve
