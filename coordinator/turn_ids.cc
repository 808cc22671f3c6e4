#include "coordinator/turn_ids.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/flags.h"

namespace recall::coordinator {

absl::Status CheckTurnId(const std::string& field, const std::string& id) {
  if (id.size() > kMaxTurnIdBytes) {
    return flags::FieldError(field, absl::StrCat(id.size(), " bytes; at most ", kMaxTurnIdBytes));
  }
  for (const char c : id) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != ':' &&
        c != '-') {
      return flags::FieldError(field, "may hold only A-Z a-z 0-9 . _ : -");
    }
  }
  return absl::OkStatus();
}

int FindTurn(const SessionRecord& rec, const std::string& turn_id) {
  for (size_t i = 0; i < rec.messages.size(); ++i) {
    const StoredMessage& m = rec.messages[i];
    if (m.role == "user" && m.turn_id == turn_id) return rec.first_message + static_cast<int>(i);
  }
  return -1;
}

StoredMessage TurnReply(const SessionRecord& rec, int user) {
  for (size_t i = static_cast<size_t>(std::max(0, user + 1 - rec.first_message));
       i < rec.messages.size(); ++i) {
    if (rec.messages[i].role == "assistant") return rec.messages[i];
  }
  StoredMessage none;
  none.role = "assistant";
  none.state = TurnState::kFailed;
  return none;
}

}  // namespace recall::coordinator
