// Chat templates: exact rendered strings for every format.
#include "worker/model/chat_template.h"

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "worker/model/chat_stops.h"

namespace recall::model {
namespace {

const std::vector<ChatMessage> kConversation = {
    {"system", "You are helpful."},
    {"user", "Hi!"},
    {"assistant", "Hello. How can I help?"},
    {"user", "Tell me a joke."},
};

std::string Render(ChatFormat format, const std::vector<ChatMessage>& messages, bool prompt) {
  absl::StatusOr<std::string> text = RenderChat(format, messages, prompt);
  EXPECT_TRUE(text.ok()) << text.status();
  return text.ok() ? *text : "";
}

TEST(ChatTemplateTest, ChatML) {
  EXPECT_EQ(Render(ChatFormat::kChatML, kConversation, true),
            "<|im_start|>system\nYou are helpful.<|im_end|>\n"
            "<|im_start|>user\nHi!<|im_end|>\n"
            "<|im_start|>assistant\nHello. How can I help?<|im_end|>\n"
            "<|im_start|>user\nTell me a joke.<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(Render(ChatFormat::kChatML, {{"user", "x"}}, false), "<|im_start|>user\nx<|im_end|>\n");
  EXPECT_EQ(ChatStopStrings(ChatFormat::kChatML), std::vector<std::string>{"<|im_end|>"});
}

TEST(ChatTemplateTest, Llama2FoldsTheSystemPromptIntoTheFirstUserTurn) {
  const std::string expected =
      "<s>[INST] <<SYS>>\nYou are helpful.\n<</SYS>>\n\nHi! [/INST] Hello. How can I help? </s>"
      "<s>[INST] Tell me a joke. [/INST]";
  EXPECT_EQ(Render(ChatFormat::kLlama2, kConversation, true), expected);
  EXPECT_EQ(Render(ChatFormat::kLlama2, kConversation, false), expected);  // nothing to add
  EXPECT_EQ(Render(ChatFormat::kLlama2, {{"user", "Hi"}}, true), "<s>[INST] Hi [/INST]");
  EXPECT_EQ(Render(ChatFormat::kLlama2, {{"system", "S"}}, true),
            "<s>[INST] <<SYS>>\nS\n<</SYS>>\n\n [/INST]");
  EXPECT_EQ(ChatStopStrings(ChatFormat::kLlama2), std::vector<std::string>{"</s>"});
}

TEST(ChatTemplateTest, Llama3) {
  EXPECT_EQ(Render(ChatFormat::kLlama3, kConversation, true),
            "<|begin_of_text|>"
            "<|start_header_id|>system<|end_header_id|>\n\nYou are helpful.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi!<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello. How can I help?<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nTell me a joke.<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(Render(ChatFormat::kLlama3, {}, false), "<|begin_of_text|>");
  EXPECT_EQ(ChatStopStrings(ChatFormat::kLlama3), std::vector<std::string>{"<|eot_id|>"});
}

TEST(ChatTemplateTest, Plain) {
  EXPECT_EQ(Render(ChatFormat::kPlain, kConversation, true),
            "system: You are helpful.\nuser: Hi!\nassistant: Hello. How can I help?\n"
            "user: Tell me a joke.\nassistant:");
  EXPECT_EQ(Render(ChatFormat::kPlain, {{"user", "a\nb"}}, false), "user: a\nb\n");
  // A reply that starts with a space (as generated after "assistant:") is not spaced
  // again, so the rendered reply is the generation prompt plus the generated text.
  EXPECT_EQ(Render(ChatFormat::kPlain, {{"user", "Hi"}, {"assistant", " Once"}}, false),
            "user: Hi\nassistant: Once\n");
  EXPECT_EQ(ChatStopStrings(ChatFormat::kPlain), std::vector<std::string>{"\nuser:"});
}

TEST(ChatTemplateTest, UnknownRoleIsInvalidArgument) {
  for (ChatFormat format :
       {ChatFormat::kPlain, ChatFormat::kChatML, ChatFormat::kLlama2, ChatFormat::kLlama3}) {
    absl::StatusOr<std::string> text = RenderChat(format, {{"user", "a"}, {"robot", "b"}}, true);
    ASSERT_FALSE(text.ok()) << ChatFormatName(format);
    EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(text.status().message().find("robot"), std::string::npos) << text.status();
  }
}

TEST(ChatTemplateTest, FormatNamesRoundTrip) {
  for (ChatFormat format :
       {ChatFormat::kPlain, ChatFormat::kChatML, ChatFormat::kLlama2, ChatFormat::kLlama3}) {
    absl::StatusOr<ChatFormat> parsed = ParseChatFormat(ChatFormatName(format));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, format);
  }
  EXPECT_EQ(*ParseChatFormat("ChatML"), ChatFormat::kChatML);
  absl::StatusOr<ChatFormat> bad = ParseChatFormat("vicuna");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("chatml"), std::string::npos) << bad.status();
}

// A model with several EOS ids (Llama 3, Qwen 2.5): every one ends a reply, before the BOS
// (llama2.c) and the format's stop.
class SeveralEndsTokenizer final : public Tokenizer {
 public:
  std::vector<int32_t> Encode(std::string_view, bool, bool) const override { return {}; }
  std::string Decode(const std::vector<int32_t>&, bool) const override { return ""; }
  std::string TokenBytes(int32_t, int32_t) const override { return ""; }
  int vocab_size() const override { return 10; }
  int32_t bos_id() const override { return 1; }
  int32_t eos_id() const override { return 2; }
  std::vector<int32_t> end_ids() const override { return {2, 7}; }
  std::optional<int32_t> PieceToId(std::string_view piece) const override {
    if (piece == "<|im_end|>") return 9;
    return std::nullopt;
  }
};

TEST(ReplyStopsTest, EveryEndIdStopsAReply) {
  const SeveralEndsTokenizer tok;
  ReplyStops stops = StopsFor(ChatFormat::kChatML, tok, /*bos_ends_sequence=*/true, true);
  EXPECT_EQ(stops.token_ids, (std::vector<int32_t>{2, 7, 1, 9}));
  EXPECT_TRUE(stops.strings.empty());
  stops = StopsFor(ChatFormat::kPlain, tok, /*bos_ends_sequence=*/false, /*chat=*/false);
  EXPECT_EQ(stops.token_ids, (std::vector<int32_t>{2, 7}));
}

// A format named for a vocabulary without its marker token is said not to fit (ChatML, Llama
// 3); one whose marker is there, plain, and Llama 2 (whose [INST] real vocabularies spell in
// pieces) fit.
TEST(ReplyStopsTest, AFormatWhoseMarkerIsNoTokenIsSaidNotToFit) {
  const SeveralEndsTokenizer tok;  // has <|im_end|> only
  EXPECT_EQ(ChatFormatMisfit(ChatFormat::kChatML, tok),
            "the vocabulary has no <|im_start|> token: the chatml format's markers are spelled "
            "out in pieces, and a reply ends only at a stop string or the model's EOS");
  EXPECT_NE(ChatFormatMisfit(ChatFormat::kLlama3, tok).find("no <|start_header_id|> token"),
            std::string::npos);
  EXPECT_EQ(ChatFormatMisfit(ChatFormat::kPlain, tok), "");
  EXPECT_EQ(ChatFormatMisfit(ChatFormat::kLlama2, tok), "");
}

}  // namespace
}  // namespace recall::model
