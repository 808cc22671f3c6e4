#include "worker/serving/turn_prompt.h"

#include "absl/strings/match.h"
#include "common/status.h"

namespace recall::serving {

absl::StatusOr<std::optional<std::string>> ContinuationText(
    model::ChatFormat format, const std::vector<model::ChatMessage>& messages,
    const std::vector<model::ChatMessage>& new_messages) {
  if (messages.empty() || messages.back().role != "assistant") return std::nullopt;
  // What follows the reply depends only on the messages from the last user message before
  // it on (every format renders message by message; the llama2 format carries a system
  // prompt to the next user message, which that user message takes): rendering those, not
  // the whole conversation, keeps a turn's cost independent of the session's length.
  size_t from = messages.size() - 1;
  while (from > 0 && messages[from].role != "user") --from;
  const std::vector<model::ChatMessage> recent(messages.begin() + static_cast<std::ptrdiff_t>(from),
                                               messages.end());
  std::vector<model::ChatMessage> all = recent;
  all.insert(all.end(), new_messages.begin(), new_messages.end());
  RECALL_ASSIGN_OR_RETURN(const std::string full, model::RenderChat(format, all, true));
  RECALL_ASSIGN_OR_RETURN(const std::string base, model::RenderChat(format, recent, false));
  if (!absl::StartsWith(full, base)) return std::nullopt;
  // How the format closes a reply: render it with a marker as content, keep what follows.
  constexpr char kMarker[] = "\x01recall-reply-end\x01";
  std::vector<model::ChatMessage> marked = recent;
  marked.back().content = kMarker;
  RECALL_ASSIGN_OR_RETURN(const std::string closing_src, model::RenderChat(format, marked, false));
  const size_t at = closing_src.rfind(kMarker);
  if (at == std::string::npos) return std::nullopt;
  return closing_src.substr(at + sizeof(kMarker) - 1) + full.substr(base.size());
}

}  // namespace recall::serving
