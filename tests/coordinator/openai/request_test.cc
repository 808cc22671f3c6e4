// The OpenAI request bodies: every field that maps to Recall's sampling, the fields ignored,
// and each refusal with the field it names (OpenAI's "param") and the limit in its message.
#include "coordinator/openai/request.h"

#include <string>

#include "common/flags.h"
#include "gtest/gtest.h"

namespace recall::openai {
namespace {

RequestLimits Limits() {
  RequestLimits l;
  l.max_message_bytes = 100;
  l.max_tokens = 512;
  return l;
}

// A chat body with `extra` fields after the messages.
std::string Chat(const std::string& extra) {
  return R"({"model":"m","messages":[{"role":"user","content":"Hi"}])" +
         (extra.empty() ? "" : "," + extra) + "}";
}

TEST(ChatRequestTest, MapsEverySamplingFieldAndIgnoresUnknownOnes) {
  const std::string body = R"({
    "model": "stories260K", "session_id": "s-1", "user": "ignored", "logit_bias": {"1": 2},
    "messages": [
      {"role": "developer", "content": "Be brief."},
      {"role": "user", "content": [{"type": "text", "text": "Once"}, {"type": "text", "text": "upon"}]},
      {"role": "assistant", "content": "a time"},
      {"role": "user", "content": "more", "name": "ann"}],
    "temperature": 0.5, "top_p": 0.9, "max_tokens": 7, "max_completion_tokens": 9,
    "stop": ["x", "yz"], "seed": -1, "top_k": 40, "repetition_penalty": 1.1,
    "frequency_penalty": 0.5, "presence_penalty": -1.25, "n": 1,
    "stream": true, "stream_options": {"include_usage": true},
    "response_format": {"type": "text"}, "tools": [], "tool_choice": "auto",
    "function_call": "none", "unknown_field": [1, 2, 3]})";
  absl::StatusOr<ChatRequest> r = ParseChatRequest(body, Limits());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->model, "stories260K");
  EXPECT_EQ(r->session_id, "s-1");
  ASSERT_EQ(r->messages.size(), 4u);
  EXPECT_EQ(r->messages[0].role, "system") << "developer is read as system";
  EXPECT_EQ(r->messages[1].content, "Once\nupon") << "text parts joined by a newline";
  EXPECT_EQ(r->messages[2].role, "assistant");
  EXPECT_EQ(r->messages[3].content, "more");
  EXPECT_FLOAT_EQ(r->sampling.temperature(), 0.5f);
  EXPECT_FLOAT_EQ(r->sampling.top_p(), 0.9f);
  EXPECT_EQ(r->sampling.max_tokens(), 9) << "max_completion_tokens wins over max_tokens";
  ASSERT_EQ(r->sampling.stop_size(), 2);
  EXPECT_EQ(r->sampling.stop(1), "yz");
  EXPECT_EQ(r->sampling.seed(), ~uint64_t{0}) << "a negative seed as its 64-bit pattern";
  absl::StatusOr<ChatRequest> top_seed =
      ParseChatRequest(Chat(R"("seed": 18446744073709551615)"), Limits());
  ASSERT_TRUE(top_seed.ok()) << top_seed.status();
  EXPECT_EQ(top_seed->sampling.seed(), ~uint64_t{0}) << "an unsigned 64-bit seed as it is";
  EXPECT_EQ(r->sampling.top_k(), 40);
  EXPECT_FLOAT_EQ(r->sampling.repetition_penalty(), 1.1f);
  EXPECT_FLOAT_EQ(r->sampling.frequency_penalty(), 0.5f);
  EXPECT_FLOAT_EQ(r->sampling.presence_penalty(), -1.25f);
  ASSERT_EQ(r->sampling.logit_bias_size(), 1);
  EXPECT_FLOAT_EQ(r->sampling.logit_bias().at(1), 2.0f);
  EXPECT_TRUE(r->stream);
  EXPECT_TRUE(r->include_usage);
}

TEST(ChatRequestTest, AbsentAndNullFieldsLeaveTheWorkersDefaults) {
  absl::StatusOr<ChatRequest> r =
      ParseChatRequest(Chat(R"("temperature":null,"stop":null,"stream":null)"), Limits());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->sampling.has_temperature());
  EXPECT_FALSE(r->sampling.has_max_tokens());
  EXPECT_EQ(r->sampling.stop_size(), 0);
  EXPECT_FALSE(r->stream);
  EXPECT_TRUE(r->session_id.empty());
  absl::StatusOr<ChatRequest> single = ParseChatRequest(Chat(R"("stop":"\n")"), Limits());
  ASSERT_TRUE(single.ok());
  ASSERT_EQ(single->sampling.stop_size(), 1) << "a single stop string";
  EXPECT_EQ(single->sampling.stop(0), "\n");
  absl::StatusOr<ChatRequest> nothing = ParseChatRequest(
      R"({"messages":[{"role":"assistant","content":null},{"role":"user","content":""}]})",
      Limits());
  ASSERT_TRUE(nothing.ok()) << nothing.status();
  EXPECT_EQ(nothing->messages[0].content, "") << "an assistant message without content";
  EXPECT_TRUE(nothing->model.empty());
}

struct Refusal {
  std::string body;
  std::string param;    // the field named ("" when none)
  std::string message;  // a part of the message
};

class ChatRefusalTest : public ::testing::TestWithParam<Refusal> {};

TEST_P(ChatRefusalTest, NamesTheFieldAndTheLimit) {
  const Refusal& c = GetParam();
  absl::StatusOr<ChatRequest> r = ParseChatRequest(c.body, Limits());
  ASSERT_FALSE(r.ok()) << c.body;
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(flags::FieldOf(r.status()), c.param) << r.status();
  EXPECT_NE(r.status().message().find(c.message), std::string::npos)
      << "\"" << r.status().message() << "\" lacks \"" << c.message << "\"";
}

INSTANTIATE_TEST_SUITE_P(
    Bodies, ChatRefusalTest,
    ::testing::Values(
        Refusal{"{\"messages\": [", "", "not valid JSON"},
        Refusal{"[1, 2]", "", "must be a JSON object, got array"},
        Refusal{"{}", "messages", "messages: is required"},
        Refusal{R"({"messages": []})", "messages", "must not be empty"},
        Refusal{R"({"messages": "hi"})", "messages", "must be an array, got string"},
        Refusal{R"({"messages": [{"content": "x"}]})", "messages[0].role", "is required"},
        Refusal{R"({"messages": [{"role": "tool", "content": "x"}]})", "messages[0].role",
                "\"tool\" is not supported"},
        Refusal{R"({"messages": [{"role": "user"}]})", "messages[0].content", "is required"},
        Refusal{R"({"messages": [{"role": "user", "content": 3}]})", "messages[0].content",
                "must be a string or an array of text parts, got number"},
        Refusal{R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})",
                "messages[0].content[0].type", "\"image_url\" is not supported"},
        Refusal{R"({"messages": [{"role": "user", "content": "x"}, {"role": "assistant",
                "content": "y"}]})",
                "messages[1].role", "the last message must be the user's, got assistant"},
        Refusal{R"({"messages": [{"role": "assistant", "content": "", "tool_calls": [{}]},
                {"role": "user", "content": "x"}]})",
                "messages[0].tool_calls", "not supported"},
        Refusal{Chat(R"("model": 3)"), "model", "must be a string, got number"},
        Refusal{Chat(R"("temperature": 3)"), "temperature", "must be in [0, 2], got 3"},
        Refusal{Chat(R"("temperature": -0.5)"), "temperature", "must be in [0, 2], got -0.5"},
        Refusal{Chat(R"("temperature": 1e999)"), "", "numbers must be finite"},
        Refusal{Chat(R"("temperature": "hot")"), "temperature", "must be a number, got string"},
        Refusal{Chat(R"("top_p": 0)"), "top_p", "must be in (0, 1], got 0"},
        Refusal{Chat(R"("top_p": 1.5)"), "top_p", "must be in (0, 1], got 1.5"},
        Refusal{Chat(R"("max_tokens": 0)"), "max_tokens", "must be in [1, 512], got 0"},
        Refusal{Chat(R"("max_tokens": 513)"), "max_tokens", "must be in [1, 512], got 513"},
        Refusal{Chat(R"("max_completion_tokens": 2.5)"), "max_completion_tokens",
                "must be an integer, got 2.5"},
        Refusal{Chat(R"("max_tokens": -1e999)"), "", "number overflow parsing '-1e999'"},
        Refusal{"{\"messages\": [{\"role\": \"user\", \"content\": \"\xff\"}]}", "",
                "not valid JSON"},
        Refusal{Chat(R"("stop": ["a", "b", "c", "d", "e"])"), "stop", "at most 4 strings, got 5"},
        Refusal{Chat(R"("stop": "")"), "stop", "must not be empty"},
        Refusal{Chat(R"("stop": ["a", 1])"), "stop[1]", "must be a string, got number"},
        Refusal{Chat(R"("seed": 1.5)"), "seed", "must be an integer"},
        Refusal{Chat(R"("seed": 18446744073709551616)"), "seed",
                "must be an integer from -9223372036854775808 to 18446744073709551615, got "
                "1.8446744073709552e+19"},
        Refusal{Chat(R"("max_tokens": 10.0)"), "max_tokens", "must be an integer, got 10.0"},
        Refusal{Chat(R"("max_tokens": 99999999999999999999999)"), "max_tokens",
                "must be an integer from -9223372036854775808 to 9223372036854775807, got "
                "9.999999999999999e+22"},  // the double it reads as
        Refusal{Chat(R"("top_k": 9223372036854775808)"), "top_k",
                "must be at most 9223372036854775807, got 9223372036854775808"},
        Refusal{Chat(R"("response_format": {"type": [1]})"), "response_format.type",
                "only \"text\" is supported, got array"},
        // Levels: the body, response_format and the arrays; 64 are read, 65 are not.
        Refusal{Chat(R"("response_format": {"type": )" + std::string(62, '[') +
                     std::string(62, ']') + "}"),
                "response_format.type", "only \"text\" is supported, got array"},
        Refusal{Chat(R"("response_format": {"type": )" + std::string(63, '[') +
                     std::string(63, ']') + "}"),
                "", "nests arrays and objects deeper than 64 levels"},
        Refusal{Chat(R"("response_format": {"type": )" + std::string(62, '[') + "1" +
                     std::string(62, ']') + "}"),
                "response_format.type", "only \"text\" is supported, got array"},
        Refusal{Chat(R"("response_format": {"type": )" + std::string(63, '[') + "1" +
                     std::string(63, ']') + "}"),
                "", "nests arrays and objects deeper than 64 levels"},
        Refusal{Chat(R"("stream_options": {"include_usage": true})"), "stream_options",
                "only allowed when stream is true"},
        Refusal{Chat(R"("top_k": -1)"), "top_k", "must not be negative (0: off), got -1"},
        Refusal{Chat(R"("repetition_penalty": 0)"), "repetition_penalty", "must be in (0, 100]"},
        Refusal{Chat(R"("logit_bias": [1])"), "logit_bias",
                "must be an object of token ids to numbers, got array"},
        Refusal{Chat(R"("logit_bias": {"x1": 5})"), "logit_bias", "key \"x1\" is not a token id"},
        Refusal{Chat(R"("logit_bias": {"-3": 5})"), "logit_bias", "key \"-3\" is not a token id"},
        Refusal{Chat(R"("logit_bias": {"7": 101})"), "logit_bias[\"7\"]",
                "must be in [-100, 100], got 101"},
        Refusal{Chat(R"("logit_bias": {"7": "ban"})"), "logit_bias[\"7\"]",
                "must be a number, got string"},
        Refusal{Chat(R"("frequency_penalty": 2.5)"), "frequency_penalty",
                "must be in [-2, 2], got 2.5"},
        Refusal{Chat(R"("presence_penalty": -3)"), "presence_penalty",
                "must be in [-2, 2], got -3"},
        Refusal{Chat(R"("presence_penalty": "high")"), "presence_penalty", "must be a number"},
        Refusal{Chat(R"("n": 2)"), "n", "only 1 is supported, got 2"},
        Refusal{Chat(R"("logprobs": 1)"), "logprobs", "must be true or false, got number"},
        Refusal{Chat(R"("top_logprobs": 2)"), "top_logprobs", "needs \"logprobs\": true"},
        Refusal{Chat(R"("logprobs": true, "top_logprobs": 21)"), "top_logprobs",
                "must be in [0, 20], got 21"},
        Refusal{Chat(R"("tools": [{"type": "function"}])"), "tools", "no tool calling"},
        Refusal{Chat(R"("tool_choice": "required")"), "tool_choice",
                "only \"none\" or \"auto\" (no tool calling), got \"required\""},
        Refusal{Chat(R"("function_call": {"name": "f"})"), "function_call",
                "only \"none\" or \"auto\" (no tool calling), got object"},
        Refusal{Chat(R"("response_format": "json")"), "response_format",
                "must be an object with \"type\": \"text\", got string"},
        Refusal{Chat(R"("response_format": {"type": null})"), "response_format.type",
                "required (only \"text\")"},
        Refusal{Chat(R"("response_format": {"type": "json_object"})"), "response_format.type",
                "only \"text\" is supported, got \"json_object\""},
        Refusal{Chat(R"("stream": "yes")"), "stream", "must be true or false, got string"},
        Refusal{Chat(R"("stream": true, "stream_options": {"include_usage": 1})"),
                "stream_options.include_usage", "must be true or false"},
        Refusal{Chat(R"("session_id": 7)"), "session_id", "must be a string, got number"},
        Refusal{
            R"({"messages": [{"role": "user", "content": ")" + std::string(101, 'x') + R"("}]})",
            "messages[0].content", "101 bytes; at most 100"}));

// The message limit is on users' messages and system prompts: an assistant message past it (the
// model's own reply, sent back with the conversation) is taken; it made every later request of
// that conversation a 400.
TEST(ChatRequestTest, TheMessageLimitIsOnUsersAndSystemPromptsNotReplies) {
  const std::string reply(300, 'r');
  absl::StatusOr<ChatRequest> r = ParseChatRequest(
      R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": ")" +
          reply + R"("}, {"role": "user", "content": "More"}]})",
      Limits());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->messages[1].content, reply);
  absl::StatusOr<ChatRequest> system =
      ParseChatRequest(R"({"messages": [{"role": "system", "content": ")" + reply +
                           R"("}, {"role": "user", "content": "More"}]})",
                       Limits());
  EXPECT_EQ(system.status().message(),
            "messages[0].content: 300 bytes; at most 100 (the server's --max-message-bytes)");
}

TEST(CompletionRequestTest, APromptOfOneStringAndTheSharedSampling) {
  absl::StatusOr<CompletionRequest> r = ParseCompletionRequest(
      R"({"model":"m","prompt":["Once upon"],"max_tokens":5,"temperature":0,"echo":false,
          "best_of":1,"logprobs":null,"suffix":"","stream":true})",
      Limits());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->prompt, "Once upon");
  EXPECT_EQ(r->sampling.max_tokens(), 5);
  EXPECT_FLOAT_EQ(r->sampling.temperature(), 0.0f);
  EXPECT_TRUE(r->stream);
  EXPECT_FALSE(r->include_usage);
  EXPECT_FALSE(r->sampling.has_logprobs()) << "null: none";
  absl::StatusOr<CompletionRequest> two =
      ParseCompletionRequest(R"({"prompt": "a", "logprobs": 2})", Limits());
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_TRUE(two->sampling.logprobs());
  EXPECT_EQ(two->sampling.top_logprobs(), 2);
}

TEST(ChatRequestTest, LogprobsAndTopLogprobs) {
  absl::StatusOr<ChatRequest> none = ParseChatRequest(Chat(R"("logprobs": false)"), Limits());
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_FALSE(none->sampling.has_logprobs());
  absl::StatusOr<ChatRequest> r =
      ParseChatRequest(Chat(R"("logprobs": true, "top_logprobs": 3)"), Limits());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->sampling.logprobs());
  EXPECT_EQ(r->sampling.top_logprobs(), 3);
}

TEST(CompletionRequestTest, RefusesWhatItDoesNotDo) {
  const std::pair<std::string, std::string> cases[] = {
      {R"({})", "prompt"},
      {R"({"prompt": ""})", "prompt"},
      {R"({"prompt": ["a", "b"]})", "prompt"},
      {R"({"prompt": [1, 2, 3]})", "prompt"},
      {R"({"prompt": 5})", "prompt"},
      {R"({"prompt": "a", "echo": true})", "echo"},
      {R"({"prompt": "a", "suffix": "b"})", "suffix"},
      {R"({"prompt": "a", "best_of": 3})", "best_of"},
      {R"({"prompt": "a", "logprobs": 6})", "logprobs"},
      {R"({"prompt": "a", "logprobs": true})", "logprobs"},
      {R"({"prompt": "a", "temperature": 9})", "temperature"},
  };
  for (const auto& [body, param] : cases) {
    absl::StatusOr<CompletionRequest> r = ParseCompletionRequest(body, Limits());
    ASSERT_FALSE(r.ok()) << body;
    EXPECT_EQ(flags::FieldOf(r.status()), param) << body << ": " << r.status();
  }
}

}  // namespace
}  // namespace recall::openai
