#include "worker/serving/turn_prompt.h"

#include <optional>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace recall::serving {
namespace {

using model::ChatFormat;

TEST(ContinuationTextTest, ClosesTheReplyThenRendersTheNewMessages) {
  const std::vector<model::ChatMessage> so_far = {{"user", "Hi"}, {"assistant", "Hello!"}};
  auto chatml = ContinuationText(ChatFormat::kChatML, so_far, {{"user", "More"}});
  ASSERT_TRUE(chatml.ok() && chatml->has_value());
  EXPECT_EQ(**chatml, "<|im_end|>\n<|im_start|>user\nMore<|im_end|>\n<|im_start|>assistant\n");

  auto plain = ContinuationText(ChatFormat::kPlain, so_far, {{"user", "More"}});
  ASSERT_TRUE(plain.ok() && plain->has_value());
  EXPECT_EQ(**plain, "\nuser: More\nassistant:");

  auto llama3 = ContinuationText(ChatFormat::kLlama3, so_far, {{"user", "More"}});
  ASSERT_TRUE(llama3.ok() && llama3->has_value());
  EXPECT_EQ((**llama3).rfind("<|eot_id|>", 0), 0u) << **llama3;
}

TEST(ContinuationTextTest, EqualsTheFreshRenderingWhenTheReplyIsRenderedVerbatim) {
  // ChatML renders a reply verbatim after its generation prompt, so cache text + the
  // continuation is exactly the rendering of the whole transcript.
  const std::vector<model::ChatMessage> so_far = {
      {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello!"}};
  const std::vector<model::ChatMessage> next = {{"user", "Bye"}};
  auto prompt = model::RenderChat(ChatFormat::kChatML, {so_far[0], so_far[1]}, true);
  auto cont = ContinuationText(ChatFormat::kChatML, so_far, next);
  std::vector<model::ChatMessage> all = so_far;
  all.push_back(next[0]);
  auto whole = model::RenderChat(ChatFormat::kChatML, all, true);
  ASSERT_TRUE(prompt.ok() && cont.ok() && cont->has_value() && whole.ok());
  EXPECT_EQ(*prompt + "Hello!" + **cont, *whole);
}

TEST(ContinuationTextTest, NothingToContinueWithoutALastReply) {
  auto r = ContinuationText(ChatFormat::kChatML, {{"user", "Hi"}}, {{"user", "More"}});
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->has_value());
  EXPECT_FALSE(
      ContinuationText(ChatFormat::kChatML, {{"user", "Hi"}, {"assistant", "x"}}, {{"robot", "?"}})
          .ok());
}

// The continuation as the whole conversation gives it: the full rendering past the
// rendering so far, after how the format closes the last reply.
std::optional<std::string> FromWholeConversation(ChatFormat format,
                                                 const std::vector<model::ChatMessage>& so_far,
                                                 const std::vector<model::ChatMessage>& next) {
  std::vector<model::ChatMessage> all = so_far;
  all.insert(all.end(), next.begin(), next.end());
  const std::string full = *model::RenderChat(format, all, true);
  const std::string base = *model::RenderChat(format, so_far, false);
  if (full.rfind(base, 0) != 0) return std::nullopt;
  std::vector<model::ChatMessage> marked = so_far;
  marked.back().content = "@@END@@";
  const std::string closing = *model::RenderChat(format, marked, false);
  return closing.substr(closing.rfind("@@END@@") + 7) + full.substr(base.size());
}

TEST(ContinuationTextTest, ReadsTheLastTurnOnlyAndGivesWhatTheWholeConversationGives) {
  // A long conversation, system prompts at the start, mid-way and just before a reply (the
  // llama2 format carries a system prompt to the next user message, or renders it alone).
  std::vector<model::ChatMessage> so_far = {{"system", "Be brief."}};
  for (int i = 0; i < 200; ++i) {
    so_far.push_back({"user", "question " + std::to_string(i)});
    so_far.push_back({"assistant", " answer " + std::to_string(i)});
    if (i == 100) so_far.push_back({"system", "Now be kind."});
  }
  std::vector<model::ChatMessage> with_late_system = so_far;
  with_late_system.insert(with_late_system.end() - 1, {"system", "late"});
  std::vector<model::ChatMessage> no_user = {{"system", "s"}, {"assistant", "a"}};
  const std::vector<std::vector<model::ChatMessage>> nexts = {
      {{"user", "More"}}, {{"system", "new rules"}, {"user", "More"}}};
  for (ChatFormat format :
       {ChatFormat::kPlain, ChatFormat::kChatML, ChatFormat::kLlama2, ChatFormat::kLlama3}) {
    for (const auto* conversation : {&so_far, &with_late_system, &no_user}) {
      for (const auto& next : nexts) {
        auto got = ContinuationText(format, *conversation, next);
        ASSERT_TRUE(got.ok()) << got.status();
        EXPECT_EQ(*got, FromWholeConversation(format, *conversation, next))
            << model::ChatFormatName(format) << ", " << conversation->size() << " messages";
      }
    }
  }
}

}  // namespace
}  // namespace recall::serving
