#include "worker/model/chat_stops.h"

namespace recall::model {

ChatFormat GuessChatFormat(const Tokenizer& tok) {
  if (tok.PieceToId("<|im_start|>")) return ChatFormat::kChatML;
  if (tok.PieceToId("<|start_header_id|>")) return ChatFormat::kLlama3;
  if (tok.PieceToId("[INST]")) return ChatFormat::kLlama2;
  return ChatFormat::kPlain;
}

std::string ChatFormatMisfit(ChatFormat format, const Tokenizer& tok) {
  const char* marker = format == ChatFormat::kChatML   ? "<|im_start|>"
                       : format == ChatFormat::kLlama3 ? "<|start_header_id|>"
                                                       : nullptr;
  if (marker == nullptr || tok.PieceToId(marker)) return "";
  return std::string("the vocabulary has no ") + marker + " token: the " + ChatFormatName(format) +
         " format's markers are spelled out in pieces, and a reply ends only at a stop string "
         "or the model's EOS";
}

ReplyStops StopsFor(ChatFormat format, const Tokenizer& tok, bool bos_ends_sequence, bool chat) {
  ReplyStops out;
  out.token_ids = tok.end_ids();
  if (bos_ends_sequence && tok.bos_id() >= 0) out.token_ids.push_back(tok.bos_id());
  if (!chat) return out;
  for (const std::string& stop : ChatStopStrings(format)) {
    if (std::optional<int32_t> id = tok.PieceToId(stop)) {
      out.token_ids.push_back(*id);
    } else {
      out.strings.push_back(stop);
    }
  }
  return out;
}

}  // namespace recall::model
