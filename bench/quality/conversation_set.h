// The conversation benchmark's evaluation set: held-out conversations with recall questions,
// as tools/train/gen_conversations.py writes them (one JSON object per line:
// {"seed", "text", "questions": [{"q", "a", "kind", "distance_tokens", ...}], ...}).
//
// Tokenized exactly as tools/train/train.py feeds the model: BOS, then every line of the
// conversation encoded on its own followed by the newline token, then "[Questions]" and its
// newline; a question is asked as the line "Q: <q>" and its newline followed by "A:", and
// answered by " <answer>" and the newline (the answer tokens a greedy decoder must produce).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/tokenizer/tokenizer.h"

namespace recall::bench {

struct QaQuestion {
  std::string q, a, kind;
  int distance_tokens = 0;      // tokens from the answer's last statement to the end
  std::vector<int32_t> ask;     // "Q: <q>" "\n" "A:"
  std::vector<int32_t> answer;  // " <a>" "\n"
};

struct QaConversation {
  uint64_t seed = 0;
  int conversation_tokens = 0;   // BOS + the conversation's lines (the budget's reference)
  std::vector<int32_t> context;  // those tokens, then "[Questions]" "\n"
  std::vector<QaQuestion> questions;
};

// Reads at most `max_conversations` conversations (0: all) and at most `max_questions` of
// each one's questions (0: all). NotFound for a missing file; InvalidArgument naming the
// line and the field for a malformed line, and for a tokenizer without a "\n" piece or
// BOS; OutOfRange if a conversation with all its questions and answers is longer than
// `max_tokens` (the model's context).
absl::StatusOr<std::vector<QaConversation>> LoadQaConversations(const std::string& path,
                                                                const model::Tokenizer& tokenizer,
                                                                int max_conversations,
                                                                int max_questions, int max_tokens);

// The tokens of `c` followed by each question and its answer, in order (what the policies'
// teacher-forced pass feeds), and where each answer starts in them.
std::vector<int32_t> QaSequence(const QaConversation& c, std::vector<int>* answer_starts);

}  // namespace recall::bench
