// A thin wrapper around libsentencepiece's processor, internal to the engine.
// sentencepiece_processor.h declares `absl::string_view` as an alias of
// std::string_view, which clashes with the installed Abseil's own class, so the
// library is only ever included by sentencepiece_model.cc, which includes no
// Abseil header; this interface uses only standard types.
#ifndef SWITCHSERVE_ENGINE_TEXT_SENTENCEPIECE_MODEL_H_
#define SWITCHSERVE_ENGINE_TEXT_SENTENCEPIECE_MODEL_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace switchserve {

// Immutable after Load; Encode/Decode are const and safe from many threads.
class SentencePieceModel {
 public:
  // nullptr on failure, with the library's reason in *error.
  static std::unique_ptr<SentencePieceModel> Load(const std::string& path, std::string* error);
  ~SentencePieceModel();

  bool Encode(std::string_view text, std::vector<int>* ids, std::string* error) const;
  // Ids outside [0, PieceSize()) are skipped.
  std::string Decode(const std::vector<int>& ids) const;
  int PieceSize() const;

 private:
  SentencePieceModel();
  std::unique_ptr<sentencepiece::SentencePieceProcessor> processor_;
};

}  // namespace switchserve

#endif  // SWITCHSERVE_ENGINE_TEXT_SENTENCEPIECE_MODEL_H_
