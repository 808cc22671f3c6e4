// NewSentencePieceProcessor for the fuzzers: the module's processor linked in directly
// (worker/tokenizer/tokenizer_sentencepiece_module.cc dlopens it with RTLD_DEEPBIND, which
// AddressSanitizer refuses).
#include "worker/tokenizer/tokenizer_sentencepiece_processor.h"

extern "C" recall::model::internal::SentencePieceProcessor* recall_new_sentencepiece_processor();

namespace recall::model::internal {

std::unique_ptr<SentencePieceProcessor> NewSentencePieceProcessor(std::string* error) {
  return std::unique_ptr<SentencePieceProcessor>(recall_new_sentencepiece_processor());
}

}  // namespace recall::model::internal
