// The OpenAI-compatible response bodies: chat.completion and text_completion objects, their
// streamed chunks as Server-Sent Events ("data: {...}\n\n", the last "data: [DONE]\n\n"),
// the model list, and errors ({"error": {"message", "type", "param", "code"}} with the HTTP
// status of the Status's code).
//
// Finish reasons: "stop" (a stop token or string), "length" (max_tokens, or the model's
// context). Usage: prompt_tokens (the whole context before the reply, cached or not),
// completion_tokens, total_tokens and prompt_tokens_details.cached_tokens (the part of the
// prompt reused from the session's cache on its worker).
// Logprobs (when the request asked): chat's {"content": [{"token", "logprob", "bytes",
// "top_logprobs": [{"token", "logprob", "bytes"}]}], "refusal": null}; completions' legacy
// {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"} (offsets in
// bytes of the reply's text). A token's "token" is its bytes as text (a UTF-8 character split
// over tokens shows U+FFFD; "bytes" has them exactly). Null when not asked.
// Thread safety: a ResponseWriter is immutable after construction.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "nlohmann/json_fwd.hpp"
#include "recall/v1/chat.pb.h"
#include "recall/v1/worker.pb.h"

namespace recall::openai {

enum class Endpoint { kChat, kCompletion };

struct HttpError {
  int status = 500;
  std::string body;  // {"error": {...}}
  // Sent as x-should-retry, which OpenAI's SDKs obey over their choice by status (they retry
  // 409, 429 and 5xx); unset: no header.
  std::optional<bool> should_retry;
  int64_t retry_after_ms = -1;  // sent as retry-after-ms and Retry-After; -1: none
};

// INVALID_ARGUMENT 400, UNAUTHENTICATED 401, PERMISSION_DENIED 403, NOT_FOUND 404,
// FAILED_PRECONDITION and ALREADY_EXISTS 409, RESOURCE_EXHAUSTED 429, UNAVAILABLE 503,
// DEADLINE_EXCEEDED 504, anything else 500. "param" is the field the message names.
// Whether to retry is what the message says ("(not retryable)", "retryable", "retry after
// N ms"); else yes for UNAVAILABLE, no for a 4xx other than 409 and 429 and for DATA_LOSS.
HttpError ErrorResponse(const absl::Status& status);
// An error after a stream began: "data: {"error": {...}}\n\n".
std::string ErrorEvent(const absl::Status& status);

// One reply: a non-stream body, or a stream's events.
class ResponseWriter {
 public:
  ResponseWriter(Endpoint endpoint, std::string model, bool include_usage);

  const std::string& id() const { return id_; }
  Endpoint endpoint() const { return endpoint_; }
  // The whole reply as one JSON body; `logprobs` null: "logprobs": null.
  std::string Body(const std::string& text, v1::FinishReason reason, const v1::Usage& usage,
                   const std::vector<v1::TokenLogprob>* logprobs = nullptr) const;
  // Stream events: the first (chat: the assistant role; completions: none), one per piece of
  // text (with its tokens' logprobs, the first at byte `text_offset` of the reply), and the
  // end (the finish reason; the usage when asked; [DONE]).
  std::string First() const;
  std::string Delta(const std::string& text,
                    const std::vector<v1::TokenLogprob>* logprobs = nullptr,
                    int64_t text_offset = 0) const;
  std::string Last(v1::FinishReason reason, const v1::Usage& usage) const;

 private:
  std::string Chunk(const std::string& text, bool role, const char* finish,
                    nlohmann::json logprobs) const;
  nlohmann::json LogprobsJson(const std::vector<v1::TokenLogprob>* logprobs,
                              int64_t text_offset) const;
  // A chunk's fields around its choices.
  nlohmann::json Envelope(nlohmann::json choices) const;

  const Endpoint endpoint_;
  const std::string model_;
  const bool include_usage_;
  const std::string id_;
  const int64_t created_;
};

// GET /v1/models and GET /v1/models/{id}.
std::string ModelList(const std::vector<v1::ModelInfo>& models);
std::string ModelObject(const v1::ModelInfo& model);

}  // namespace recall::openai
