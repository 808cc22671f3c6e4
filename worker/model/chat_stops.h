// What ends an assistant reply for a chat format and tokenizer, and which format a
// tokenizer's vocabulary suggests. Shared by `recall generate --chat` and the worker.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "worker/model/chat_template.h"
#include "worker/tokenizer/tokenizer.h"

namespace recall::model {

// ChatML when the vocabulary has <|im_start|>, Llama 3 for <|start_header_id|>, Llama 2 for
// [INST], else plain.
ChatFormat GuessChatFormat(const Tokenizer& tok);

// "" when `format` fits the vocabulary; for ChatML and Llama 3 (whose markers are special
// tokens of the models that use them) without their marker token, why the format does not
// fit: each marker is spelled out in pieces and the end-of-turn marker can never be sampled
// as one token (a --chat-format the model was not trained on).
std::string ChatFormatMisfit(ChatFormat format, const Tokenizer& tok);

struct ReplyStops {
  std::vector<int32_t> token_ids;
  std::vector<std::string> strings;
};

// The tokenizer's EOS ids (end_ids()); its BOS too when `bos_ends_sequence` (the llama2.c
// convention: run.c stops at BOS); and, when `chat`, the format's stop strings: as token ids when
// the vocabulary holds them as one piece (e.g. <|im_end|>), else as strings.
ReplyStops StopsFor(ChatFormat format, const Tokenizer& tok, bool bos_ends_sequence, bool chat);

}  // namespace recall::model
