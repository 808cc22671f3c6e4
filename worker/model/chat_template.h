// Chat templates: render a conversation into the prompt text a model was trained on.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace recall::model {

enum class ChatFormat { kPlain, kChatML, kLlama2, kLlama3 };

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

// "plain", "chatml", "llama2", "llama3"; InvalidArgument naming the accepted values.
absl::StatusOr<ChatFormat> ParseChatFormat(const std::string& name);
const char* ChatFormatName(ChatFormat format);

// The prompt text for `messages`; with add_generation_prompt the text ends where the
// assistant's reply begins. InvalidArgument for an unknown role.
absl::StatusOr<std::string> RenderChat(ChatFormat format, const std::vector<ChatMessage>& messages,
                                       bool add_generation_prompt);

// The stop strings that end an assistant turn in this format (e.g. "<|im_end|>").
std::vector<std::string> ChatStopStrings(ChatFormat format);

}  // namespace recall::model
