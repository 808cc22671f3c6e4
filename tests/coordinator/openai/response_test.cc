// The OpenAI response bodies: errors with their HTTP status, type, param and code; the
// chat.completion and text_completion bodies; a stream's events from the role chunk to
// [DONE], with the usage chunk only when asked.
#include "coordinator/openai/response.h"

#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "common/flags.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace recall::openai {
namespace {

using Json = nlohmann::json;

v1::Usage MakeUsage(int prompt, int cached, int generated) {
  v1::Usage u;
  u.set_prompt_tokens(prompt);
  u.set_cached_tokens(cached);
  u.set_generated_tokens(generated);
  return u;
}

// The JSON objects of a stream's "data: " events; "[DONE]" as a string.
std::vector<Json> Events(const std::string& stream) {
  std::vector<Json> out;
  for (absl::string_view event : absl::StrSplit(stream, "\n\n", absl::SkipEmpty())) {
    EXPECT_EQ(event.substr(0, 6), "data: ") << event;
    const absl::string_view data = event.substr(6);
    out.push_back(data == "[DONE]" ? Json("[DONE]") : Json::parse(data));
  }
  return out;
}

TEST(ErrorResponseTest, StatusCodesMapToHttpWithTheFieldAsParam) {
  struct Case {
    absl::Status status;
    int http;
    std::string type;
    Json param;
    Json code;
  };
  const Case cases[] = {
      {flags::FieldError("temperature", "must be in [0, 2], got 3"), 400, "invalid_request_error",
       "temperature", nullptr},
      {absl::InvalidArgumentError("messages: the conversation needs 600 tokens"), 400,
       "invalid_request_error", "messages", nullptr},
      {absl::InvalidArgumentError("the request body is not valid JSON (x: y)"), 400,
       "invalid_request_error", nullptr, nullptr},
      {absl::UnauthenticatedError("authorization: unknown API key"), 401, "invalid_request_error",
       "authorization", "invalid_api_key"},
      {absl::NotFoundError("session_id: no session \"x\""), 404, "invalid_request_error",
       "session_id", "not_found"},
      {absl::NotFoundError("model: no worker serves \"gpt-4\""), 404, "invalid_request_error",
       "model", "model_not_found"},
      {absl::FailedPreconditionError("session_id: a turn of this session is running"), 409,
       "invalid_request_error", "session_id", "conflict"},
      {absl::AbortedError("the turn was taken over by another writer while its reply streamed"),
       409, "invalid_request_error", nullptr, "conflict"},
      {absl::ResourceExhaustedError("workers full; retry after 50 ms"), 429, "rate_limit_error",
       nullptr, "rate_limit_exceeded"},
      {absl::UnavailableError("no worker could take the turn (x); retryable"), 503, "server_error",
       nullptr, "unavailable"},
      {absl::InternalError("boom"), 500, "server_error", nullptr, nullptr},
  };
  for (const Case& c : cases) {
    const HttpError e = ErrorResponse(c.status);
    EXPECT_EQ(e.status, c.http) << c.status;
    const Json body = Json::parse(e.body);
    EXPECT_EQ(body["error"]["message"], std::string(c.status.message()));
    EXPECT_EQ(body["error"]["type"], c.type) << c.status;
    EXPECT_EQ(body["error"]["param"], c.param) << c.status;
    EXPECT_EQ(body["error"]["code"], c.code) << c.status;
  }
  // The worker's names of the gRPC request's fields become the HTTP request's.
  const HttpError worker =
      ErrorResponse(absl::InvalidArgumentError("sampling.stop[0]: 5000000 bytes; at most 256"));
  EXPECT_EQ(worker.status, 400);
  const Json worker_body = Json::parse(worker.body);
  EXPECT_EQ(worker_body["error"]["param"], "stop[0]");
  EXPECT_EQ(worker_body["error"]["message"], "stop[0]: 5000000 bytes; at most 256");
  const std::vector<Json> event = Events(ErrorEvent(absl::UnavailableError("gone")));
  ASSERT_EQ(event.size(), 1u);
  EXPECT_EQ(event[0]["error"]["message"], "gone");
}

TEST(ErrorResponseTest, SaysWhetherToRetryAsTheMessageDoes) {
  struct Case {
    absl::Status status;
    std::optional<bool> retry;
    int64_t after_ms;
  };
  const Case cases[] = {
      // 409s OpenAI's SDKs would retry: a limit is final, a running turn is not.
      {absl::FailedPreconditionError("session_id: the session has reached the limit of 3 turns "
                                     "(the coordinator's max_turns); start a new session, or "
                                     "have the limit raised (not retryable)"),
       false, -1},
      {absl::FailedPreconditionError("session_id: a turn of this session is running; send the "
                                     "next when it ends (retryable)"),
       true, -1},
      // The worker's hint becomes the SDKs' backoff.
      {absl::ResourceExhaustedError("the worker is full: 4 turns running and 8 waiting (queue "
                                    "limit 8); retry after 250 ms"),
       true, 250},
      {absl::ResourceExhaustedError("tenant has 5 sessions, the limit is 5; delete some (not "
                                    "retryable)"),
       false, -1},
      {absl::UnavailableError("no worker could take the turn (x)"), true, -1},
      {absl::DataLossError("session store: damaged"), false, -1},
      {absl::InvalidArgumentError("temperature: must be in [0, 2]"), false, -1},
      {absl::NotFoundError("session_id: no session \"x\""), false, -1},
      // No word either way: the SDK's own choice.
      {absl::InternalError("boom"), std::nullopt, -1},
      {absl::AbortedError("another writer took the turn over"), std::nullopt, -1},
  };
  for (const Case& c : cases) {
    const HttpError e = ErrorResponse(c.status);
    EXPECT_EQ(e.should_retry, c.retry) << c.status;
    EXPECT_EQ(e.retry_after_ms, c.after_ms) << c.status;
  }
}

TEST(ResponseWriterTest, ChatBodyWithFinishReasonAndUsage) {
  const ResponseWriter w(Endpoint::kChat, "stories260K", false);
  const Json body =
      Json::parse(w.Body("Once upon", v1::FINISH_REASON_LENGTH, MakeUsage(20, 12, 5)));
  EXPECT_EQ(body["object"], "chat.completion");
  EXPECT_EQ(body["id"], w.id());
  EXPECT_EQ(w.id().rfind("chatcmpl-", 0), 0u);
  EXPECT_EQ(body["model"], "stories260K");
  EXPECT_GT(body["created"].get<int64_t>(), 1600000000);
  const Json& choice = body["choices"][0];
  EXPECT_EQ(choice["message"]["role"], "assistant");
  EXPECT_EQ(choice["message"]["content"], "Once upon");
  EXPECT_EQ(choice["finish_reason"], "length");
  EXPECT_EQ(body["usage"]["prompt_tokens"], 20);
  EXPECT_EQ(body["usage"]["completion_tokens"], 5);
  EXPECT_EQ(body["usage"]["total_tokens"], 25);
  EXPECT_EQ(body["usage"]["prompt_tokens_details"]["cached_tokens"], 12);
  EXPECT_EQ(Json::parse(w.Body("", v1::FINISH_REASON_CONTEXT, {}))["choices"][0]["finish_reason"],
            "length")
      << "the context's end reads as length";
}

TEST(ResponseWriterTest, ChatStreamFromRoleToDoneWithUsageWhenAsked) {
  const ResponseWriter w(Endpoint::kChat, "m", /*include_usage=*/true);
  const std::vector<Json> events = Events(w.First() + w.Delta("Once") + w.Delta(" upon") +
                                          w.Last(v1::FINISH_REASON_STOP, MakeUsage(10, 4, 2)));
  ASSERT_EQ(events.size(), 6u);
  EXPECT_EQ(events[0]["object"], "chat.completion.chunk");
  EXPECT_EQ(events[0]["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(events[0]["usage"], nullptr) << "usage is null on every chunk but the last";
  EXPECT_EQ(events[1]["choices"][0]["delta"]["content"], "Once");
  EXPECT_FALSE(events[1]["choices"][0]["delta"].contains("role"));
  EXPECT_EQ(events[1]["choices"][0]["finish_reason"], nullptr);
  EXPECT_EQ(events[2]["choices"][0]["delta"]["content"], " upon");
  EXPECT_EQ(events[3]["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(events[3]["choices"][0]["delta"], Json::object());
  EXPECT_EQ(events[4]["choices"], Json::array());
  EXPECT_EQ(events[4]["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
  EXPECT_EQ(events[5], "[DONE]");
  for (int i = 0; i < 5; ++i) EXPECT_EQ(events[i]["id"], w.id()) << "one id for the stream";

  const ResponseWriter plain(Endpoint::kChat, "m", false);
  const std::vector<Json> short_stream =
      Events(plain.First() + plain.Last(v1::FINISH_REASON_LENGTH, {}));
  ASSERT_EQ(short_stream.size(), 3u) << "no usage chunk unless asked";
  EXPECT_FALSE(short_stream[0].contains("usage"));
  EXPECT_EQ(short_stream[2], "[DONE]");
}

TEST(ResponseWriterTest, TextCompletionBodyAndStream) {
  const ResponseWriter w(Endpoint::kCompletion, "m", false);
  EXPECT_EQ(w.id().rfind("cmpl-", 0), 0u);
  const Json body = Json::parse(w.Body("there was", v1::FINISH_REASON_STOP, MakeUsage(3, 0, 2)));
  EXPECT_EQ(body["object"], "text_completion");
  EXPECT_EQ(body["choices"][0]["text"], "there was");
  EXPECT_EQ(body["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(w.First(), "") << "a text completion stream has no role chunk";
  const std::vector<Json> events =
      Events(w.Delta("there") + w.Last(v1::FINISH_REASON_LENGTH, MakeUsage(3, 0, 1)));
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0]["object"], "text_completion");
  EXPECT_EQ(events[0]["choices"][0]["text"], "there");
  EXPECT_EQ(events[1]["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(events[2], "[DONE]");
}

// A logprob is always a number: nlohmann writes NaN and infinities as null, which OpenAI's
// schema does not allow (a model with broken weights gave NaN). -9999 is OpenAI's "no chance".
TEST(ResponseWriterTest, LogprobsAreNumbersEvenWhenNotFinite) {
  v1::TokenLogprob lp;
  lp.set_token("a");
  lp.set_logprob(std::numeric_limits<float>::quiet_NaN());
  lp.add_top_ids(1);
  lp.add_top_tokens("b");
  lp.add_top_logprobs(-std::numeric_limits<float>::infinity());
  lp.add_top_ids(2);
  lp.add_top_tokens("c");
  lp.add_top_logprobs(-0.5f);
  const std::vector<v1::TokenLogprob> lps = {lp};
  const ResponseWriter chat(Endpoint::kChat, "m", false);
  const Json c =
      Json::parse(chat.Body("a", v1::FINISH_REASON_STOP, {}, &lps))["choices"][0]["logprobs"];
  EXPECT_EQ(c["content"][0]["logprob"], -9999.0) << c.dump();
  EXPECT_EQ(c["content"][0]["top_logprobs"][0]["logprob"], -9999.0) << c.dump();
  EXPECT_EQ(c["content"][0]["top_logprobs"][1]["logprob"], -0.5) << c.dump();
  const ResponseWriter text(Endpoint::kCompletion, "m", false);
  const Json t =
      Json::parse(text.Body("a", v1::FINISH_REASON_STOP, {}, &lps))["choices"][0]["logprobs"];
  EXPECT_EQ(t["token_logprobs"][0], -9999.0) << t.dump();
  EXPECT_EQ(t["top_logprobs"][0]["b"], -9999.0) << t.dump();
}

TEST(ModelListTest, ListsTheServedModels) {
  v1::ModelInfo m;
  m.set_name("stories260K");
  m.set_context_length(512);
  m.set_workers(2);
  const Json list = Json::parse(ModelList({m}));
  EXPECT_EQ(list["object"], "list");
  ASSERT_EQ(list["data"].size(), 1u);
  EXPECT_EQ(list["data"][0]["id"], "stories260K");
  EXPECT_EQ(list["data"][0]["object"], "model");
  EXPECT_EQ(list["data"][0]["context_length"], 512);
  EXPECT_EQ(Json::parse(ModelObject(m))["workers"], 2);
}

}  // namespace
}  // namespace recall::openai
