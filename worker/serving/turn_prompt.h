// The text a follow-up turn appends to a session's cache.
//
// After a reply ends, the cache holds the conversation's rendering up to the generation
// prompt, then the generated reply. What must follow is how the chat format closes that
// reply (e.g. "<|im_end|>\n" for ChatML), then the new messages and the next generation
// prompt. The cache can differ from a fresh rendering of the transcript in details the
// template normalises (a space after "assistant:"), which is what a cache that persists
// between turns means; a rebuild renders the transcript afresh.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/model/chat_template.h"

namespace recall::serving {

// `messages` is the conversation so far and ends with the assistant reply the cache holds.
// nullopt when the template does not render the conversation as a stable prefix (the
// caller then rebuilds); InvalidArgument for an unknown role.
absl::StatusOr<std::optional<std::string>> ContinuationText(
    model::ChatFormat format, const std::vector<model::ChatMessage>& messages,
    const std::vector<model::ChatMessage>& new_messages);

}  // namespace recall::serving
