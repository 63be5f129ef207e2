// No Abseil includes here: see sentencepiece_model.h.
#include "engine/text/sentencepiece_model.h"

#include <sentencepiece_processor.h>

namespace switchserve {

SentencePieceModel::SentencePieceModel()
    : processor_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {}

SentencePieceModel::~SentencePieceModel() = default;

std::unique_ptr<SentencePieceModel> SentencePieceModel::Load(const std::string& path,
                                                             std::string* error) {
  std::unique_ptr<SentencePieceModel> model(new SentencePieceModel());
  const sentencepiece::util::Status status = model->processor_->Load(path);
  if (!status.ok()) {
    *error = status.ToString();
    return nullptr;
  }
  return model;
}

bool SentencePieceModel::Encode(std::string_view text, std::vector<int>* ids,
                                std::string* error) const {
  const sentencepiece::util::Status status = processor_->Encode(text, ids);
  if (!status.ok()) *error = status.ToString();
  return status.ok();
}

std::string SentencePieceModel::Decode(const std::vector<int>& ids) const {
  const int size = processor_->GetPieceSize();
  std::vector<int> known;
  known.reserve(ids.size());
  for (int id : ids) {
    if (id >= 0 && id < size) known.push_back(id);
  }
  std::string text;
  if (!processor_->Decode(known, &text).ok()) return std::string();
  return text;
}

int SentencePieceModel::PieceSize() const { return processor_->GetPieceSize(); }

}  // namespace switchserve
