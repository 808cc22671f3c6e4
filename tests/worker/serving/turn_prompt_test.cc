#include "worker/serving/turn_prompt.h"

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

}  // namespace
}  // namespace recall::serving
