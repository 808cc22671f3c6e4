// No Abseil header may be included here (see the header).
#include "worker/model/tokenizer_sentencepiece_processor.h"

#include <sentencepiece_processor.h>

namespace recall::model::internal {

struct SentencePieceProcessor::Impl {
  sentencepiece::SentencePieceProcessor sp;
};

SentencePieceProcessor::SentencePieceProcessor() : impl_(std::make_unique<Impl>()) {}
SentencePieceProcessor::~SentencePieceProcessor() = default;

bool SentencePieceProcessor::LoadFromSerializedProto(const std::string& data, std::string* error) {
  const sentencepiece::util::Status status = impl_->sp.LoadFromSerializedProto(data);
  if (!status.ok()) *error = status.ToString();
  return status.ok();
}

bool SentencePieceProcessor::Encode(std::string_view text, std::vector<int>* ids,
                                    std::string* error) const {
  const sentencepiece::util::Status status = impl_->sp.Encode(text, ids);
  if (!status.ok()) *error = status.ToString();
  return status.ok();
}

bool SentencePieceProcessor::Decode(const std::vector<int>& ids, std::string* text,
                                    std::string* error) const {
  const sentencepiece::util::Status status = impl_->sp.Decode(ids, text);
  if (!status.ok()) *error = status.ToString();
  return status.ok();
}

int SentencePieceProcessor::GetPieceSize() const { return impl_->sp.GetPieceSize(); }
std::string SentencePieceProcessor::IdToPiece(int id) const { return impl_->sp.IdToPiece(id); }
int SentencePieceProcessor::PieceToId(std::string_view piece) const {
  return impl_->sp.PieceToId(piece);
}
bool SentencePieceProcessor::IsControl(int id) const { return impl_->sp.IsControl(id); }
bool SentencePieceProcessor::IsByte(int id) const { return impl_->sp.IsByte(id); }
bool SentencePieceProcessor::IsUnknown(int id) const { return impl_->sp.IsUnknown(id); }
int SentencePieceProcessor::bos_id() const { return impl_->sp.bos_id(); }
int SentencePieceProcessor::eos_id() const { return impl_->sp.eos_id(); }

}  // namespace recall::model::internal
