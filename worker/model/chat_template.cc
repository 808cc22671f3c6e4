// Chat templates. Each format renders the text its models were trained on:
//   plain   "{role}: {content}\n" per message; generation prompt "assistant:".
//   chatml  "<|im_start|>{role}\n{content}<|im_end|>\n"; prompt "<|im_start|>assistant\n".
//   llama2  "<s>[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST] {assistant} </s>"
//           then "<s>[INST] {user} [/INST]" for each further exchange. A system message is
//           folded into the next user message (alone
//           if none follows). The text already ends where the assistant's
//           reply begins, so the generation prompt adds nothing.
//   llama3  "<|begin_of_text|>" then "<|start_header_id|>{role}<|end_header_id|>\n\n
//           {content}<|eot_id|>"; prompt "<|start_header_id|>assistant<|end_header_id|>\n\n".
// BOS: llama2 and llama3 texts start with their BOS written out ("<s>",
// "<|begin_of_text|>"); encode them with add_bos=false and parse_special=true, which turns
// the markers into the BOS/EOS ids (all three tokenizer formats do this). chatml and plain
// contain no BOS: add one with add_bos if the model wants it.
// Message contents are inserted verbatim (no trimming).
#include "worker/model/chat_template.h"

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace recall::model {
namespace {

absl::Status CheckRoles(const std::vector<ChatMessage>& messages) {
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    if (role != "system" && role != "user" && role != "assistant") {
      return absl::InvalidArgumentError(absl::StrCat("message ", i, ": unknown role \"", role,
                                                     "\" (expected system, user or assistant)"));
    }
  }
  return absl::OkStatus();
}

std::string RenderLlama2(const std::vector<ChatMessage>& messages) {
  std::string out;
  std::string pending_system;
  bool have_system = false;
  for (const ChatMessage& m : messages) {
    if (m.role == "system") {
      pending_system = m.content;
      have_system = true;
    } else if (m.role == "user") {
      absl::StrAppend(&out, "<s>[INST] ");
      if (have_system) {
        absl::StrAppend(&out, "<<SYS>>\n", pending_system, "\n<</SYS>>\n\n");
        have_system = false;
      }
      absl::StrAppend(&out, m.content, " [/INST]");
    } else {
      absl::StrAppend(&out, " ", m.content, " </s>");
    }
  }
  if (have_system) {  // no user message followed: the system prompt stands alone
    absl::StrAppend(&out, "<s>[INST] <<SYS>>\n", pending_system, "\n<</SYS>>\n\n [/INST]");
  }
  return out;
}

}  // namespace

absl::StatusOr<ChatFormat> ParseChatFormat(const std::string& name) {
  const std::string lower = absl::AsciiStrToLower(name);
  if (lower == "plain") return ChatFormat::kPlain;
  if (lower == "chatml") return ChatFormat::kChatML;
  if (lower == "llama2") return ChatFormat::kLlama2;
  if (lower == "llama3") return ChatFormat::kLlama3;
  return absl::InvalidArgumentError(absl::StrCat("unknown chat format \"", name,
                                                 "\" (expected plain, chatml, llama2 or llama3)"));
}

const char* ChatFormatName(ChatFormat format) {
  switch (format) {
    case ChatFormat::kPlain:
      return "plain";
    case ChatFormat::kChatML:
      return "chatml";
    case ChatFormat::kLlama2:
      return "llama2";
    case ChatFormat::kLlama3:
      return "llama3";
  }
  return "unknown";
}

absl::StatusOr<std::string> RenderChat(ChatFormat format, const std::vector<ChatMessage>& messages,
                                       bool add_generation_prompt) {
  if (absl::Status s = CheckRoles(messages); !s.ok()) return s;
  std::string out;
  switch (format) {
    case ChatFormat::kPlain:
      // "role: content"; no extra space when the content already starts with one (a reply
      // generated after "assistant:" usually does), so a rendered reply is exactly the
      // generation prompt followed by the generated text.
      for (const ChatMessage& m : messages) {
        const bool spaced = !m.content.empty() && m.content[0] == ' ';
        absl::StrAppend(&out, m.role, spaced ? ":" : ": ", m.content, "\n");
      }
      if (add_generation_prompt) out += "assistant:";
      break;
    case ChatFormat::kChatML:
      for (const ChatMessage& m : messages) {
        absl::StrAppend(&out, "<|im_start|>", m.role, "\n", m.content, "<|im_end|>\n");
      }
      if (add_generation_prompt) out += "<|im_start|>assistant\n";
      break;
    case ChatFormat::kLlama2:
      out = RenderLlama2(messages);
      break;
    case ChatFormat::kLlama3:
      out = "<|begin_of_text|>";
      for (const ChatMessage& m : messages) {
        absl::StrAppend(&out, "<|start_header_id|>", m.role, "<|end_header_id|>\n\n", m.content,
                        "<|eot_id|>");
      }
      if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      break;
  }
  return out;
}

std::vector<std::string> ChatStopStrings(ChatFormat format) {
  switch (format) {
    case ChatFormat::kPlain:
      return {"\nuser:"};
    case ChatFormat::kChatML:
      return {"<|im_end|>"};
    case ChatFormat::kLlama2:
      return {"</s>"};
    case ChatFormat::kLlama3:
      return {"<|eot_id|>"};
  }
  return {};
}

}  // namespace recall::model
