// No Abseil header may be included here (see sp_reference.h).
#include "tests/worker/tokenizer/sp_reference.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

namespace recall::model::testing {

struct SentencePieceReference::Impl {
  sentencepiece::SentencePieceProcessor sp;
};

SentencePieceReference::SentencePieceReference(const std::string& model_path)
    : impl_(std::make_unique<Impl>()) {
  const auto status = impl_->sp.Load(model_path);
  if (!status.ok()) error_ = status.ToString();
}

SentencePieceReference::~SentencePieceReference() = default;

std::vector<int> SentencePieceReference::Encode(const std::string& text) const {
  std::vector<int> ids;
  if (!impl_->sp.Encode(text, &ids).ok()) ids.clear();
  return ids;
}

std::string SentencePieceReference::Decode(const std::vector<int>& ids) const {
  std::string text;
  if (!impl_->sp.Decode(ids, &text).ok()) text.clear();
  return text;
}

std::string TrainSentencePieceModel(const std::string& flags) {
  const auto status = sentencepiece::SentencePieceTrainer::Train(flags + " --minloglevel=2");
  return status.ok() ? "" : status.ToString();
}

}  // namespace recall::model::testing
