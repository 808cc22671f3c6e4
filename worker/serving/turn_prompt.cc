#include "worker/serving/turn_prompt.h"

#include "absl/strings/match.h"
#include "common/status.h"

namespace recall::serving {

absl::StatusOr<std::optional<std::string>> ContinuationText(
    model::ChatFormat format, const std::vector<model::ChatMessage>& messages,
    const std::vector<model::ChatMessage>& new_messages) {
  if (messages.empty() || messages.back().role != "assistant") return std::nullopt;
  std::vector<model::ChatMessage> all = messages;
  all.insert(all.end(), new_messages.begin(), new_messages.end());
  RECALL_ASSIGN_OR_RETURN(const std::string full, model::RenderChat(format, all, true));
  RECALL_ASSIGN_OR_RETURN(const std::string base, model::RenderChat(format, messages, false));
  if (!absl::StartsWith(full, base)) return std::nullopt;
  // How the format closes a reply: render it with a marker as content, keep what follows.
  constexpr char kMarker[] = "\x01recall-reply-end\x01";
  std::vector<model::ChatMessage> marked = messages;
  marked.back().content = kMarker;
  RECALL_ASSIGN_OR_RETURN(const std::string closing_src, model::RenderChat(format, marked, false));
  const size_t at = closing_src.rfind(kMarker);
  if (at == std::string::npos) return std::nullopt;
  return closing_src.substr(at + sizeof(kMarker) - 1) + full.substr(base.size());
}

}  // namespace recall::serving
