// Turn ids: a client's name for one turn of a session (gRPC ConverseRequest.turn_id, the HTTP
// API's Idempotency-Key header), stored on the turn's user message, so that a request sent
// again after a broken connection finds the turn instead of running it twice.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "coordinator/session_store.h"

namespace recall::coordinator {

inline constexpr size_t kMaxTurnIdBytes = 128;

// OK for "" (no id) and for at most 128 bytes of A-Z a-z 0-9 . _ : -; else InvalidArgument
// naming `field`.
absl::Status CheckTurnId(const std::string& field, const std::string& id);

// The position in the transcript of the user message whose turn id is `turn_id` (among the
// messages rec holds: rec.messages[i] is message rec.first_message + i), or -1.
int FindTurn(const SessionRecord& rec, const std::string& turn_id);

// The reply of the turn whose user message is the transcript's message `user` (rec holds it):
// the first assistant message after it; none stored gives an empty message in state kFailed
// (nothing was sent).
StoredMessage TurnReply(const SessionRecord& rec, int user);

}  // namespace recall::coordinator
