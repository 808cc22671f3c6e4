#include "worker/serving/replay.h"

#include "common/status.h"
#include "worker/serving/stop_text.h"
#include "worker/serving/turn_prompt.h"

namespace recall::serving {

absl::StatusOr<std::optional<ReplayPlan>> PlanReplay(
    model::ChatFormat format, const model::Tokenizer& tokenizer,
    const std::vector<model::ChatMessage>& history,
    const std::vector<std::optional<ReplyRecord>>& replies,
    const std::vector<model::ChatMessage>& messages) {
  std::vector<model::ChatMessage> all = history;
  all.insert(all.end(), messages.begin(), messages.end());
  // The model's replies (those with their record) end the turns; a reply the client wrote
  // is one of a turn's messages, rendered as text with the others, as the turn fed it.
  const auto model_reply = [&](size_t i) {
    return history[i].role == "assistant" && i < replies.size() && replies[i].has_value();
  };
  size_t first = 0;
  while (first < history.size() && !model_reply(first)) ++first;
  if (first == history.size()) return std::nullopt;
  ReplayPlan plan;
  // The first turn: the rendering up to its generation prompt.
  const std::vector<model::ChatMessage> opening(all.begin(), all.begin() + first);
  RECALL_ASSIGN_OR_RETURN(std::string text, model::RenderChat(format, opening, true));
  plan.tokens = tokenizer.Encode(text, true);
  for (size_t a = first; a < history.size();) {
    // history[a] is a reply.
    if (a >= replies.size() || !replies[a].has_value() || plan.tokens.empty()) return std::nullopt;
    const ReplyRecord& reply = *replies[a];
    model::TokenStreamDecoder decoder(tokenizer);
    decoder.Next(plan.tokens.back());
    decoder.Flush();
    std::string decoded;
    std::vector<int64_t> ends;  // as the turn noted them (Scheduler::Turn::text_ends)
    for (int32_t id : reply.token_ids) {
      if (id < 0 || id >= tokenizer.vocab_size()) return std::nullopt;
      decoded += decoder.Next(id);
      ends.push_back(decoder.holding() ? -1 : static_cast<int64_t>(decoded.size()));
    }
    decoded += decoder.Flush();
    const std::string& content = history[a].content;
    // Cut at a stop string: the reply is what its tokens said before it (whatever the finish:
    // the last bytes a length end flushes can complete one too).
    const bool cut =
        decoded.size() > content.size() && decoded.compare(0, content.size(), content) == 0;
    if (decoded != content && !cut) return std::nullopt;
    // Fed as decode steps: every reply token a later step fed. After a stop token all were
    // (the stop token itself never is); after a length end the last one goes first in the
    // next prompt; after a cut, all but the last (which completed the stop string), and those
    // after the cut were given back (Scheduler::CutAtStop).
    const bool all_fed = reply.finish == TurnFinish::kStop && !cut;
    const size_t stepped =
        all_fed || reply.token_ids.empty() ? reply.token_ids.size() : reply.token_ids.size() - 1;
    // (An empty range too: the next turn's prompt starts a chunk of its own, as it did.)
    const size_t begin = plan.tokens.size();
    plan.step_ranges.emplace_back(begin, begin + stepped);
    plan.tokens.insert(plan.tokens.end(), reply.token_ids.begin(),
                       reply.token_ids.begin() + static_cast<std::ptrdiff_t>(stepped));
    std::vector<int32_t> prompt;
    std::string tail;  // the text the cut left of the tokens given back
    if (cut) {
      const TokensAtCut at = TokensBeforeCut(ends, content.size(), static_cast<int>(stepped));
      if (stepped > static_cast<size_t>(at.tokens)) {
        plan.give_backs.emplace_back(begin + at.tokens, begin + stepped);
      }
      tail = content.substr(at.tail);
    }
    // Aborted turns taken back after it: fed as they were (their prompt a chunk of its own,
    // their reply one per step), then given back.
    for (const TakenBackTurn& taken : reply.taken_back_after) {
      const size_t n = taken.token_ids.size();
      if (taken.prompt_tokens < 0 || static_cast<size_t>(taken.prompt_tokens) > n) {
        return std::nullopt;
      }
      for (int32_t id : taken.token_ids) {
        if (id < 0 || id >= tokenizer.vocab_size()) return std::nullopt;
      }
      if (n == 0) continue;
      const size_t from = plan.tokens.size();
      plan.tokens.insert(plan.tokens.end(), taken.token_ids.begin(), taken.token_ids.end());
      plan.step_ranges.emplace_back(from + static_cast<size_t>(taken.prompt_tokens), from + n);
      plan.give_backs.emplace_back(from, from + n);
    }
    if (!cut) {
      prompt.assign(reply.token_ids.begin() + static_cast<std::ptrdiff_t>(stepped),
                    reply.token_ids.end());
    }
    // The next prompt: how the format closes this reply, then the messages up to the next
    // reply (or the end, this turn's messages included).
    size_t next = a + 1;
    while (next < history.size() && !model_reply(next)) ++next;
    const size_t upto = next < history.size() ? next : all.size();
    if (upto == a + 1) return std::nullopt;  // two replies in a row: no turn between them
    const std::vector<model::ChatMessage> before(all.begin(), all.begin() + a + 1);
    const std::vector<model::ChatMessage> after(all.begin() + a + 1, all.begin() + upto);
    RECALL_ASSIGN_OR_RETURN(std::optional<std::string> more,
                            ContinuationText(format, before, after));
    if (!more.has_value()) return std::nullopt;
    const std::vector<int32_t> encoded = tokenizer.Encode(tail + *more, false);
    prompt.insert(prompt.end(), encoded.begin(), encoded.end());
    plan.tokens.insert(plan.tokens.end(), prompt.begin(), prompt.end());
    a = next;
  }
  return plan;
}

}  // namespace recall::serving
