// Exact rebuild of a session from its transcript.
//
// A session's cache was built turn by turn: each turn's prompt fed as prefill chunks (the
// first turn the rendered conversation, later ones how the chat format closes the previous
// reply and the new messages, after that reply's last sampled token), and each reply fed one
// token per decode step, with the evictor stepping after each. Prefilling the whole
// transcript instead gives a different cache once a policy evicts (the evictor never sees
// the decode steps) and different float rounding even without one (prefill and decode
// attention differ), so the session's next reply could differ from the one it would have
// given. PlanReplay rebuilds the token sequence of that history and says which tokens the
// original fed as decode steps, so the scheduler feeds them the same way.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/model/chat_template.h"
#include "worker/serving/turn_stream.h"
#include "worker/tokenizer/tokenizer.h"

namespace recall::serving {

// An assistant message's reply as a worker produced it.
struct ReplyRecord {
  std::vector<int32_t> token_ids;  // as streamed (a stop token is not among them)
  TurnFinish finish = TurnFinish::kLength;
  // The aborted turns after it that were taken back before the next turn, in order.
  std::vector<TakenBackTurn> taken_back_after;
};

struct ReplayPlan {
  std::vector<int32_t> tokens;                         // the whole prompt, BOS first
  // [begin, end) fed one per decode step, one per reply (an empty one still ends a prefill
  // chunk there, where the next turn's prompt began).
  std::vector<std::pair<size_t, size_t>> step_ranges;
  // [first, end) of `tokens`, the end of a step range: a reply cut at a stop string, whose
  // tokens after the cut its turn gave back once fed (Scheduler::CutAtStop, which decides
  // alike here), or an aborted turn taken back (ReplyRecord::taken_back_after).
  std::vector<std::pair<size_t, size_t>> give_backs;
};

// The replay of `history` (with `replies[i]` for each reply the model gave, nullopt for an
// assistant message the client wrote, which its turn fed as text with its other messages)
// followed by this turn's `messages`. nullopt when it cannot be exact: no reply yet (then a
// prefill of the rendering is exactly what the first turn did), a reply whose tokens do not
// decode to its text (nor to it and more, after a stop: a reply cut at a stop string), or
// a chat format that cannot continue, or a taken-back turn whose tokens are not the model's.
absl::StatusOr<std::optional<ReplayPlan>> PlanReplay(
    model::ChatFormat format, const model::Tokenizer& tokenizer,
    const std::vector<model::ChatMessage>& history,
    const std::vector<std::optional<ReplyRecord>>& replies,
    const std::vector<model::ChatMessage>& messages);

}  // namespace recall::serving
