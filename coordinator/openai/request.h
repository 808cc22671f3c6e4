// The OpenAI-compatible request bodies, parsed and checked into typed structs:
// POST /v1/chat/completions (ChatRequest) and POST /v1/completions (CompletionRequest).
//
// What maps to what (recall.v1.SamplingParams):
//   temperature            [0, 2]           -> temperature (0: greedy)
//   top_p                  (0, 1]           -> top_p
//   max_completion_tokens  [1, limit]       -> max_tokens (max_tokens when it is absent;
//     or max_tokens                            limit: the workers' max_tokens_limit)
//   stop                   a string, or an array of at most 4 non-empty strings -> stop
//   seed                   an integer       -> seed (a negative one as its 64-bit pattern)
//   top_k >= 0, repetition_penalty > 0      -> the same (not OpenAI's fields; vLLM's)
//   logit_bias  {"token id": [-100, 100]}  -> logit_bias (ids checked by the worker against
//                                              its vocabulary)
//   frequency_penalty, presence_penalty  [-2, 2] -> the same (over the reply's tokens so far)
//   logprobs (chat: true/false), top_logprobs [0, 20] (needs logprobs)
//                                           -> logprobs, top_logprobs
//   logprobs (completions: the legacy integer) [0, 5] -> logprobs, top_logprobs
//   n: 1 only; tools / functions, a response_format other than "text", echo, suffix,
//     best_of > 1: refused. Every other field is ignored, as OpenAI's servers ignore
//     unknown fields.
// Messages: role "system", "developer" (read as system), "user" or "assistant"; content a
// string or an array of {"type": "text", "text": ...} parts (joined by "\n"); the last
// message is the user's.
//
// Errors are InvalidArgument with the field as a flags::FieldError payload (flags::FieldOf:
// OpenAI's "param") and a message naming the field and the limit: "temperature: must be in
// [0, 2], got 3". A number that is not finite (1e999) is refused like one out of range.
// Thread safety: pure functions.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "recall/v1/worker.pb.h"

namespace recall::openai {

// top_logprobs (chat) and logprobs (completions): OpenAI's limits.
inline constexpr int kMaxTopLogprobs = 20;
inline constexpr int kMaxCompletionLogprobs = 5;

struct RequestLimits {
  size_t max_message_bytes = 256 << 10;  // one message's content, or the prompt
  int max_tokens = 0;                    // the workers' limit; 0: not checked here
};

struct Message {
  std::string role;  // system, user or assistant
  std::string content;
};

struct ChatRequest {
  std::string model;              // "" when not given
  std::vector<Message> messages;  // at least one; the last from the user
  v1::SamplingParams sampling;    // the fields the request set
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  std::string session_id;      // the body's "session_id"; "" when not given
};

struct CompletionRequest {
  std::string model;
  std::string prompt;  // a string, or an array of exactly one string
  v1::SamplingParams sampling;
  bool stream = false;
  bool include_usage = false;
};

absl::StatusOr<ChatRequest> ParseChatRequest(absl::string_view body, const RequestLimits& limits);
absl::StatusOr<CompletionRequest> ParseCompletionRequest(absl::string_view body,
                                                         const RequestLimits& limits);

}  // namespace recall::openai
