// The OpenAI-compatible HTTP API of a real recall-coordinator (--http-listen) in front of a
// real recall-worker (stories260K), over loopback with cpp-httplib's client, reading the raw
// bytes: SSE framing ("data: {...}\n\n" chunks, the role first, the finish reason, the usage
// chunk when asked, "data: [DONE]\n\n" last); one chat.completion body; /v1/completions,
// /v1/models, /health; a multi-turn chat that resends the whole list and reuses the session's
// cache (cached tokens > 0), with the session named, and matched without a name; a diverging
// list rebuilding the session in place; OpenAI's error bodies with their HTTP statuses; API
// keys and tenants; HTTPS and mTLS; `recall serve` with the API on; and a client leaving
// mid-stream, whose turn the worker drops within a measured bound.
#include <httplib.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/subprocess.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "recall/v1/chat.grpc.pb.h"
#include "recall/v1/worker.grpc.pb.h"
#include "tests/common/test_certs.h"
#include "tests/common/test_util.h"
#include "tests/integration/http_get.h"
#include "tests/integration/openai_http_util.h"

namespace recall {
namespace {

TEST_F(OpenAiHttpTest, AStreamedChatIsServerSentEventsEndingInDone) {
  const HttpReply r = Post("/v1/chat/completions",
                           ChatBody({Message("user", "Once upon a time")}, 12, /*stream=*/true));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.Header("Content-Type"), "text/event-stream");
  EXPECT_EQ(r.Header("X-Session-Id").rfind("s-", 0), 0u) << "a new session's id";
  const std::vector<std::string> events = Events(r.body);
  ASSERT_GE(events.size(), 4u) << r.body;
  EXPECT_EQ(events.back(), "[DONE]");
  const Json first = Json::parse(events[0]);
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  std::string text;
  for (size_t i = 1; i + 3 < events.size(); ++i) {
    const Json e = Json::parse(events[i]);
    EXPECT_EQ(e["id"], first["id"]) << "one id for the whole stream";
    EXPECT_EQ(e["choices"][0]["finish_reason"], nullptr);
    EXPECT_EQ(e["usage"], nullptr) << "include_usage: null usage on every chunk but the last";
    text += e["choices"][0]["delta"]["content"].get<std::string>();
  }
  EXPECT_FALSE(text.empty());
  const Json finish = Json::parse(events[events.size() - 3]);
  EXPECT_EQ(finish["choices"][0]["finish_reason"], "length") << "12 tokens, max_tokens 12";
  const Json usage = Json::parse(events[events.size() - 2]);
  EXPECT_EQ(usage["choices"], Json::array());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 12);
  EXPECT_GT(usage["usage"]["prompt_tokens"].get<int>(), 0);
  EXPECT_EQ(usage["usage"]["total_tokens"].get<int>(),
            usage["usage"]["prompt_tokens"].get<int>() + 12);
  // The stored transcript holds what was streamed.
  const v1::Session s = GetSession(r.Header("X-Session-Id"));
  ASSERT_EQ(s.messages_size(), 2);
  EXPECT_EQ(s.messages(1).content(), text);
}

TEST_F(OpenAiHttpTest, ANonStreamedChatIsOneChatCompletion) {
  const HttpReply r =
      Post("/v1/chat/completions", ChatBody({Message("user", "Once upon a time")}, 5, false));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.Header("Content-Type"), "application/json");
  const Json j = r.JsonBody();
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["model"], "stories260K.bin") << "the session's model, when the request names none";
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_FALSE(j["choices"][0]["message"]["content"].get<std::string>().empty());
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], 5);
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 0) << "a new session";
  // A stop string ends the reply with "stop", and the stop string is not in it.
  const std::string text = j["choices"][0]["message"]["content"];
  ASSERT_GE(text.size(), 3u) << text;
  const std::string stop = text.substr(1, 2);  // complete by the second or third token
  const HttpReply stopped = Post(
      "/v1/chat/completions",
      ChatBody({Message("user", "Once upon a time")}, 5, false, "\"stop\":" + Json(stop).dump()));
  ASSERT_EQ(stopped.status, 200) << stopped.body;
  EXPECT_EQ(stopped.JsonBody()["choices"][0]["finish_reason"], "stop") << stopped.body;
}

// logit_bias reaches the worker's picks (greedy here): +100 on token 300 makes every token
// that one whatever the prompt, and -100 on every other token of the vocabulary gives the same
// reply; without a bias the reply is another.
TEST_F(OpenAiHttpTest, LogitBiasForcesAndBansTokens) {
  const auto reply = [&](const std::string& prompt, const std::string& bias) {
    const HttpReply r = Post("/v1/chat/completions", ChatBody({Message("user", prompt)}, 6, false,
                                                              R"("temperature": 0)" + bias));
    EXPECT_EQ(r.status, 200) << r.body;
    const Json j = r.JsonBody();
    EXPECT_EQ(j["usage"]["completion_tokens"], 6) << r.body;
    return j["choices"][0]["message"]["content"].get<std::string>();
  };
  const std::string plain = reply("Once upon a time", "");
  const std::string forced = reply("Once upon a time", R"(, "logit_bias": {"300": 100})");
  EXPECT_NE(forced, plain);
  EXPECT_EQ(reply("Tom went out", R"(, "logit_bias": {"300": 100})"), forced);
  Json ban_all_but_300 = Json::object();
  for (int t = 0; t < 512; ++t) {
    if (t != 300) ban_all_but_300[std::to_string(t)] = -100;
  }
  EXPECT_EQ(reply("Once upon a time", ", \"logit_bias\": " + ban_all_but_300.dump()), forced);
}

// OpenAI's frequency and presence penalties reach the sampler: a greedy reply changes, and
// the same request gives the same reply again.
TEST_F(OpenAiHttpTest, FrequencyAndPresencePenaltiesChangeAGreedyReply) {
  const auto reply = [&](const std::string& penalties) {
    const HttpReply r = Post("/v1/completions", R"({"prompt": "Once upon a time", "max_tokens": 24,
                                    "temperature": 0)" +
                                                    penalties + "}");
    EXPECT_EQ(r.status, 200) << r.body;
    return r.JsonBody()["choices"][0]["text"].get<std::string>();
  };
  const std::string plain = reply("");
  const std::string penalized = reply(R"(, "frequency_penalty": 2, "presence_penalty": 1)");
  EXPECT_NE(penalized, plain);
  EXPECT_EQ(reply(R"(, "frequency_penalty": 2, "presence_penalty": 1)"), penalized);
  EXPECT_EQ(Post("/v1/completions", R"({"prompt": "x", "presence_penalty": 2.5})").status, 400);
}

// Logprobs: the chat form (per token: token, logprob, bytes, top_logprobs) whole and streamed,
// and the completions' legacy form; the same greedy request gives the same entries both ways.
TEST_F(OpenAiHttpTest, LogprobsComeWithEveryTokenWholeAndStreamed) {
  const std::string extra = R"("temperature": 0, "logprobs": true, "top_logprobs": 2)";
  const HttpReply whole = Post("/v1/chat/completions",
                               ChatBody({Message("user", "Once upon a time")}, 10, false, extra));
  ASSERT_EQ(whole.status, 200) << whole.body;
  const Json body = whole.JsonBody();
  const Json& content = body["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), body["usage"]["completion_tokens"].get<size_t>()) << whole.body;
  std::string spelled;
  for (const Json& e : content) {
    ASSERT_EQ(e["top_logprobs"].size(), 2u) << e;
    EXPECT_EQ(e["top_logprobs"][0]["token"], e["token"]) << "greedy: the most likely first";
    EXPECT_LE(e["top_logprobs"][1]["logprob"].get<double>(), e["logprob"].get<double>());
    for (const Json& b : e["bytes"]) spelled.push_back(static_cast<char>(b.get<int>()));
  }
  EXPECT_EQ(spelled, body["choices"][0]["message"]["content"].get<std::string>());

  const HttpReply streamed = Post("/v1/chat/completions",
                                  ChatBody({Message("user", "Once upon a time")}, 10, true, extra));
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  Json entries = Json::array();
  for (const std::string& e : Events(streamed.body)) {
    if (e == "[DONE]") break;
    const Json chunk = Json::parse(e);
    if (chunk["choices"].empty() || chunk["choices"][0]["logprobs"].is_null()) continue;
    for (const Json& entry : chunk["choices"][0]["logprobs"]["content"]) entries.push_back(entry);
  }
  EXPECT_EQ(entries, content) << "the same greedy tokens, streamed";

  const HttpReply plain =
      Post("/v1/chat/completions", ChatBody({Message("user", "Once upon a time")}, 4, false));
  EXPECT_TRUE(plain.JsonBody()["choices"][0]["logprobs"].is_null()) << plain.body;

  const HttpReply completion =
      Post("/v1/completions",
           R"({"prompt": "Once upon a time", "max_tokens": 6, "temperature": 0, "logprobs": 3})");
  ASSERT_EQ(completion.status, 200) << completion.body;
  const Json completion_body = completion.JsonBody();
  const Json& choice = completion_body["choices"][0];
  const Json& lp = choice["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 6u) << completion.body;
  std::string joined;
  for (size_t i = 0; i < 6; ++i) {
    EXPECT_EQ(lp["text_offset"][i].get<size_t>(), joined.size());
    joined += lp["tokens"][i].get<std::string>();
    EXPECT_LE(lp["top_logprobs"][i].size(), 3u);
    EXPECT_EQ(lp["top_logprobs"][i][lp["tokens"][i].get<std::string>()], lp["token_logprobs"][i])
        << "greedy: the token is among its alternatives, with its logprob";
  }
  EXPECT_EQ(joined, choice["text"].get<std::string>());
}

// The same list sent again after its session went on (a client's retry, another client
// with the same conversation) is a new session; its replies are replayed with the tokens the
// model gave them, so the greedy reply is the one the first session gave. Tokenized anew from
// their text they gave another reply (found by probing: "Anna's ship is..." against "Anna's
// owner is...").
TEST_F(OpenAiHttpTest, AListSentAgainAfterItsSessionWentOnGetsTheSameReply) {
  const auto chat = [&](const std::vector<Json>& messages) {
    const HttpReply r = Post("/v1/chat/completions", ChatBody(messages, 20, false));
    EXPECT_EQ(r.status, 200) << r.body;
    return std::make_pair(r.JsonBody()["choices"][0]["message"]["content"].get<std::string>(),
                          r.Header("X-Session-Id"));
  };
  for (const char* first : {"Hello there", "Lily and Tom went to the park"}) {
    const std::vector<Json> m0 = {Message("user", first)};
    const auto [reply, s1] = chat(m0);
    std::vector<Json> m1 = m0;
    m1.push_back(Message("assistant", reply));
    m1.push_back(Message("user", "client 1 says no"));
    const auto [continued, s1_again] = chat(m1);
    EXPECT_EQ(s1_again, s1) << "the list extends the session";
    const auto [again, s2] = chat(m1);
    EXPECT_NE(s2, s1) << "the session went on: a new one";
    EXPECT_EQ(again, continued) << first;
  }
}

TEST_F(OpenAiHttpTest, ResendingTheWholeListReusesTheSessionsCache) {
  std::vector<Json> messages = {Message("system", "Tell a story."),
                                Message("user", "Once upon a time")};
  const HttpReply one = Post("/v1/chat/completions", ChatBody(messages, 16, true));
  ASSERT_EQ(one.status, 200) << one.body;
  const std::string id = one.Header("X-Session-Id");
  std::string reply;
  for (const std::string& e : Events(one.body)) {
    if (e == "[DONE]") break;
    const Json j = Json::parse(e);
    if (!j["choices"].empty() && j["choices"][0]["delta"].contains("content")) {
      reply += j["choices"][0]["delta"]["content"].get<std::string>();
    }
  }
  ASSERT_FALSE(reply.empty());

  // The usual OpenAI client: the whole list again, plus the next message; the session named.
  messages.push_back(Message("assistant", reply));
  messages.push_back(Message("user", "What happened next?"));
  const HttpReply two =
      Post("/v1/chat/completions", ChatBody(messages, 16, true), "key-a", {{"X-Session-Id", id}});
  ASSERT_EQ(two.status, 200) << two.body;
  EXPECT_EQ(two.Header("X-Session-Id"), id) << "the same session";
  const std::vector<std::string> events = Events(two.body);
  const Json usage = Json::parse(events[events.size() - 2])["usage"];
  EXPECT_GT(usage["prompt_tokens_details"]["cached_tokens"].get<int>(), 0)
      << "the worker continued the session's cache: " << usage;
  EXPECT_EQ(GetSession(id).messages_size(), 5) << "one transcript, stored once";

  // The same again without naming the session (a stateless client): matched by its list.
  std::string reply2;
  for (size_t i = 1; i + 3 < events.size(); ++i) {
    reply2 += Json::parse(events[i])["choices"][0]["delta"]["content"].get<std::string>();
  }
  messages.push_back(Message("assistant", reply2));
  messages.push_back(Message("user", "And then?"));
  const HttpReply three = Post("/v1/chat/completions", ChatBody(messages, 8, false));
  ASSERT_EQ(three.status, 200) << three.body;
  EXPECT_EQ(three.Header("X-Session-Id"), id) << "the list extends that session's transcript";
  EXPECT_GT(three.JsonBody()["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 0)
      << three.body;
  EXPECT_EQ(GetSession(id).messages_size(), 7);

  // A list that diverges (the first user message edited): the session is rebuilt in place.
  const std::vector<Json> edited = {Message("system", "Tell a story."),
                                    Message("user", "Once there was a cat")};
  const HttpReply four =
      Post("/v1/chat/completions", ChatBody(edited, 8, false), "key-a", {{"X-Session-Id", id}});
  ASSERT_EQ(four.status, 200) << four.body;
  EXPECT_EQ(four.Header("X-Session-Id"), id) << "rebuilt, not forked";
  EXPECT_EQ(four.JsonBody()["usage"]["prompt_tokens_details"]["cached_tokens"], 0)
      << "the cache was rebuilt from the new list";
  const v1::Session rebuilt = GetSession(id);
  ASSERT_EQ(rebuilt.messages_size(), 3) << "the transcript is the request's list and its reply";
  EXPECT_EQ(rebuilt.messages(1).content(), "Once there was a cat");
  EXPECT_EQ(rebuilt.messages(2).content(),
            four.JsonBody()["choices"][0]["message"]["content"].get<std::string>());
}

// A stateless client's conversation keeps its session (and the worker's warm cache) when its
// next request reaches a coordinator that did not serve the last one: here the same one after
// a restart, as another replica sharing the store would. The index of transcripts is in the
// store, not only in the coordinator's memory.
TEST_F(OpenAiHttpTest, AnUnnamedConversationKeepsItsSessionAcrossACoordinatorRestart) {
  std::vector<Json> messages = {Message("user", "Once upon a time")};
  const HttpReply one = Post("/v1/chat/completions", ChatBody(messages, 8, false));
  ASSERT_EQ(one.status, 200) << one.body;
  const std::string id = one.Header("X-Session-Id");
  coordinator_.Stop();
  StartCoordinator();
  messages.push_back(
      Message("assistant", one.JsonBody()["choices"][0]["message"]["content"].get<std::string>()));
  messages.push_back(Message("user", "What happened next?"));
  const HttpReply two = Post("/v1/chat/completions", ChatBody(messages, 8, false));
  ASSERT_EQ(two.status, 200) << two.body;
  EXPECT_EQ(two.Header("X-Session-Id"), id) << "the session it continues, not a new one";
  EXPECT_GT(two.JsonBody()["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 0)
      << two.body;
  EXPECT_EQ(GetSession(id).messages_size(), 4);
  // Another tenant with the same list starts its own session.
  const HttpReply theirs = Post("/v1/chat/completions", ChatBody(messages, 8, false), "key-b");
  ASSERT_EQ(theirs.status, 200) << theirs.body;
  EXPECT_NE(theirs.Header("X-Session-Id"), id);
}

// --session-ttl: a session idle longer than it is deleted, from the store and from its
// worker's cache; the same list sent again starts a new session, and naming the old one is
// 404.
TEST_F(OpenAiHttpTest, ASessionIdleLongerThanTheTtlIsDeleted) {
  coordinator_.Stop();
  StartCoordinator({"--session-ttl", "2"});
  const std::string body = ChatBody({Message("user", "Once upon a time")}, 4, false);
  const HttpReply first = Post("/v1/chat/completions", body);
  ASSERT_EQ(first.status, 200) << first.body;
  const std::string id = first.Header("X-Session-Id");
  EXPECT_EQ(SessionCount(), 1);
  EXPECT_EQ(WorkerLoad(worker_).resident_sessions(), 1);
  EXPECT_EQ(StoredRecords("t:"), 2) << "its transcript and its opening, in the index";
  int count = 1;
  for (int i = 0; i < 200 && count > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    count = SessionCount();
  }
  EXPECT_EQ(count, 0) << "deleted within 20 s (a 2 s ttl, swept every second)";
  EXPECT_EQ(StoredRecords("t:"), 0) << "its index records went with it";
  int cached = 1;  // the cache goes after the store's record (the worker's DropSession)
  for (int i = 0; i < 50 && cached > 0; ++i) {
    const v1::LoadReport load = WorkerLoad(worker_);
    cached = load.resident_sessions() + load.offloaded_sessions();
    if (cached > 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(cached, 0) << "its cache dropped within 5 s";
  const HttpReply named = Post("/v1/chat/completions", body, "key-a", {{"X-Session-Id", id}});
  EXPECT_EQ(named.status, 404) << named.body;
  EXPECT_NE(named.body.find("sessions idle for 2 s are deleted"), std::string::npos) << named.body;
  // Over gRPC too (recall chat --session reads it first).
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", "Bearer key-a");
  v1::GetSessionRequest get;
  get.set_session_id(id);
  v1::Session gone;
  const grpc::Status st = chat_->GetSession(&ctx, get, &gone);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND) << st.error_message();
  EXPECT_NE(st.error_message().find("sessions idle for 2 s are deleted"), std::string::npos)
      << st.error_message();
  const HttpReply again = Post("/v1/chat/completions", body);
  ASSERT_EQ(again.status, 200) << again.body;
  EXPECT_NE(again.Header("X-Session-Id"), id) << "a new session, not the deleted one";
}

// An unnamed list past --max-turns is refused for its turns (409 naming messages), not for
// the session it would need when the tenant has --max-sessions already (429, which says
// deleting sessions would help).
TEST_F(OpenAiHttpTest, AListPastTheTurnLimitIsRefusedForItsTurnsWhenNoSessionIsLeft) {
  coordinator_.Stop();
  StartCoordinator({"--max-turns", "1", "--max-sessions", "1"});
  const HttpReply one =
      Post("/v1/chat/completions", ChatBody({Message("user", "Once upon a time")}, 2, false));
  ASSERT_EQ(one.status, 200) << one.body;
  const HttpReply two = Post(
      "/v1/chat/completions",
      ChatBody({Message("user", "A cat"), Message("assistant", "sat."), Message("user", "Then?")},
               2, false));
  EXPECT_EQ(two.status, 409) << two.body;
  EXPECT_EQ(two.JsonBody()["error"]["param"], "messages") << two.body;
  EXPECT_EQ(two.Header("x-should-retry"), "false");
}

TEST_F(OpenAiHttpTest, CompletionsModelsAndHealth) {
  const HttpReply c =
      Post("/v1/completions", R"({"prompt":"Once upon a time","max_tokens":6,"temperature":0})");
  ASSERT_EQ(c.status, 200) << c.body;
  EXPECT_EQ(c.JsonBody()["object"], "text_completion");
  EXPECT_FALSE(c.JsonBody()["choices"][0]["text"].get<std::string>().empty());
  EXPECT_EQ(c.JsonBody()["usage"]["completion_tokens"], 6);
  EXPECT_EQ(c.Header("X-Session-Id"), "") << "a completion belongs to no session";
  const HttpReply cs =
      Post("/v1/completions",
           R"({"prompt":"Once upon a time","max_tokens":6,"temperature":0,"stream":true})");
  ASSERT_EQ(cs.status, 200) << cs.body;
  const std::vector<std::string> events = Events(cs.body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(Json::parse(events[0])["object"], "text_completion");
  EXPECT_EQ(Json::parse(events[events.size() - 2])["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(events.back(), "[DONE]");

  const HttpReply models = Send(*http_, "GET", "/v1/models", "", "key-a");
  ASSERT_EQ(models.status, 200) << models.body;
  EXPECT_EQ(models.JsonBody()["object"], "list");
  ASSERT_EQ(models.JsonBody()["data"].size(), 1u);
  EXPECT_EQ(models.JsonBody()["data"][0]["id"], "stories260K.bin");
  EXPECT_EQ(models.JsonBody()["data"][0]["context_length"], 512);
  EXPECT_EQ(Send(*http_, "GET", "/v1/models/stories260K.bin", "", "key-a").status, 200);
  const HttpReply missing = Send(*http_, "GET", "/v1/models/gpt-4", "", "key-a");
  EXPECT_EQ(missing.status, 404);
  EXPECT_EQ(missing.JsonBody()["error"]["code"], "model_not_found");
  EXPECT_EQ(missing.JsonBody()["error"]["message"],
            "model: no worker serves \"gpt-4\"; served: \"stories260K.bin\"");

  const HttpReply health = Send(*http_, "GET", "/health", "", "");
  EXPECT_EQ(health.status, 200) << "no API key needed";
  EXPECT_EQ(health.JsonBody()["healthy_workers"], 1);
}

// A TCP connection to 127.0.0.1:port; -1 when it cannot connect.
int ConnectLoopback(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// A POST with no body at all (curl -X POST URL): told so at once (it waited 5 s for a body,
// then said "cannot be read"); the connection is closed. To a route of another method, or to
// none, it is 405 or 404 as with a body (it was 400 "no body"); a PUT or PATCH without a body
// too (it waited 5 s).
TEST_F(OpenAiHttpTest, APostWithoutABodyIsToldItHasNone) {
  const std::vector<std::tuple<std::string, std::string, std::string>> cases = {
      {"POST", "/v1/chat/completions", "HTTP/1.1 400"},
      {"POST", "/v1/models", "HTTP/1.1 405"},
      {"POST", "/health", "HTTP/1.1 405"},
      {"POST", "/v1/nothing", "HTTP/1.1 404"},
      {"PUT", "/v1/chat/completions", "HTTP/1.1 405"},
      {"PATCH", "/v1/nothing", "HTTP/1.1 404"}};
  for (const auto& [method, path, status] : cases) {
    const int fd = ConnectLoopback(coordinator_.port("http"));
    ASSERT_GE(fd, 0);
    const std::string request =
        method + " " + path + " HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
    ASSERT_EQ(send(fd, request.data(), request.size(), MSG_NOSIGNAL),
              static_cast<ssize_t>(request.size()));
    const absl::Time start = absl::Now();
    std::string response;
    char buf[4096];
    for (ssize_t n; (n = recv(fd, buf, sizeof(buf), 0)) > 0;)
      response.append(buf, static_cast<size_t>(n));
    close(fd);
    EXPECT_EQ(response.rfind(status, 0), 0u) << path << ": " << response;
    EXPECT_LT(absl::ToDoubleSeconds(absl::Now() - start), 4.0) << "not after the read timeout";
    if (status == "HTTP/1.1 400") {
      EXPECT_NE(response.find("the request has no body"), std::string::npos) << response;
    } else if (status == "HTTP/1.1 405") {
      const std::string allowed = path == "/v1/chat/completions" ? "POST" : "GET";
      EXPECT_NE(response.find("Allow: " + allowed), std::string::npos) << response;
      EXPECT_NE(response.find("method not allowed; use " + allowed), std::string::npos) << response;
    } else {
      EXPECT_NE(response.find("no route " + method + " /v1/nothing"), std::string::npos)
          << response;
    }
  }
}

// A POST without a valid API key is not held in memory: a client asking first (Expect:
// 100-continue, as curl does past 1 MB) hears the 401 without sending its body (here 50 MB by
// its Content-Length, never sent); one sending it has it read and dropped, and the connection
// stays in step (its next request, with the key, is answered). The server read and held up
// to 64 MiB per connection before the 401.
TEST_F(OpenAiHttpTest, APostWithoutAKeyIsNotHeldInMemory) {
  const auto exchange = [&](const std::string& bytes) {
    const int fd = ConnectLoopback(coordinator_.port("http"));
    EXPECT_GE(fd, 0);
    size_t sent = 0;
    while (sent < bytes.size()) {
      const ssize_t n = send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) break;
      sent += static_cast<size_t>(n);
    }
    std::string response;
    char buf[4096];
    for (ssize_t n; (n = recv(fd, buf, sizeof(buf), 0)) > 0;)
      response.append(buf, static_cast<size_t>(n));
    close(fd);
    return response;
  };
  const std::string head =
      "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n";
  for (const std::string& auth : {std::string(), std::string("Authorization: Bearer nope\r\n")}) {
    const absl::Time start = absl::Now();
    const std::string asked = exchange(head + auth +
                                       "Expect: 100-continue\r\nConnection: close\r\n"
                                       "Content-Length: 50000000\r\n\r\n");
    EXPECT_EQ(asked.rfind("HTTP/1.1 401", 0), 0u) << asked;
    EXPECT_NE(asked.find("invalid_api_key"), std::string::npos) << asked;
    EXPECT_LT(absl::ToDoubleSeconds(absl::Now() - start), 4.0) << "not after the read timeout";
  }
  // 5 MB sent whole without a key on a kept-alive connection; once its 401 is in, a request
  // with the key on the same connection is answered (the body was read to its end).
  const int fd = ConnectLoopback(coordinator_.port("http"));
  ASSERT_GE(fd, 0);
  const std::string first =
      head + "Content-Length: " + std::to_string(5 << 20) + "\r\n\r\n" + std::string(5 << 20, ' ');
  for (size_t sent = 0; sent < first.size();) {
    const ssize_t n = send(fd, first.data() + sent, first.size() - sent, MSG_NOSIGNAL);
    ASSERT_GT(n, 0);
    sent += static_cast<size_t>(n);
  }
  std::string both;
  char buf[4096];
  while (both.find("}}") == std::string::npos) {  // the end of the 401's error body
    const ssize_t n = recv(fd, buf, sizeof(buf), 0);
    ASSERT_GT(n, 0) << both;
    both.append(buf, static_cast<size_t>(n));
  }
  const std::string next =
      "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer key-a\r\n"
      "Connection: close\r\n\r\n";
  ASSERT_EQ(send(fd, next.data(), next.size(), MSG_NOSIGNAL), static_cast<ssize_t>(next.size()));
  for (ssize_t n; (n = recv(fd, buf, sizeof(buf), 0)) > 0;)
    both.append(buf, static_cast<size_t>(n));
  close(fd);
  EXPECT_EQ(both.rfind("HTTP/1.1 401", 0), 0u) << both.substr(0, 300);
  EXPECT_NE(both.find("HTTP/1.1 200", 1), std::string::npos) << both.substr(0, 600);
  EXPECT_EQ(both.find("HTTP/1.1 400"), std::string::npos) << "the body was not read as requests";
  // A request with its key is served as before.
  EXPECT_EQ(Post("/v1/chat/completions", ChatBody({Message("user", "Hi")}, 4, false)).status, 200);
}

// A chunked body (no Content-Length) past the 64 MiB limit is 413, held to the limit; the
// rest of the body is read and dropped, so the connection's next request is answered. The
// coordinator read and held all of one (400 MiB: 240 to 1886 MB), then answered 400 for its
// content; then, stopped at the limit, the rest of the body was read as ~800 requests.
TEST_F(OpenAiHttpTest, AChunkedBodyPastTheLimitIs413) {
  for (const char* key : {"key-a", "nope"}) {
    const int fd = ConnectLoopback(coordinator_.port("http"));
    ASSERT_GE(fd, 0);
    std::thread sender([fd, key] {
      std::string out = absl::StrCat(
          "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
          "Authorization: Bearer ",
          key, "\r\nTransfer-Encoding: chunked\r\n\r\n");
      const std::string chunk = "2000\r\n" + std::string(0x2000, ' ') + "\r\n";  // 8 KiB
      for (int i = 0; i < 80 * 128 && send(fd, out.data(), out.size(), MSG_NOSIGNAL) > 0; ++i) {
        out = chunk;  // 80 MiB
      }
      send(fd, "0\r\n\r\n", 5, MSG_NOSIGNAL);
    });
    std::string response;
    char buf[4096];
    while (response.find("}}") == std::string::npos) {  // the end of the first answer's body
      const ssize_t n = recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) break;
      response.append(buf, static_cast<size_t>(n));
    }
    sender.join();
    // The next request on the connection, once the first is answered (cpp-httplib reads no
    // request sent right behind a body).
    const std::string next =
        "GET /v1/models HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer key-a\r\n"
        "Connection: close\r\n\r\n";
    send(fd, next.data(), next.size(), MSG_NOSIGNAL);
    for (ssize_t n; (n = recv(fd, buf, sizeof(buf), 0)) > 0;)
      response.append(buf, static_cast<size_t>(n));
    close(fd);
    const bool keyed = std::string(key) == "key-a";
    EXPECT_EQ(response.rfind(keyed ? "HTTP/1.1 413" : "HTTP/1.1 401", 0), 0u)
        << key << ": " << response.substr(0, 300);
    if (keyed) {
      EXPECT_NE(response.find("larger than 67108864 bytes"), std::string::npos) << response;
    }
    // Then the models list, and nothing else: the body was not read as requests.
    size_t answers = 0;
    for (size_t at = 0; (at = response.find("HTTP/1.1 ", at)) != std::string::npos; ++at) {
      ++answers;
    }
    EXPECT_EQ(answers, 2u) << response.substr(0, 600);
    EXPECT_NE(response.find("HTTP/1.1 200"), std::string::npos) << response.substr(0, 600);
  }
  EXPECT_EQ(Post("/v1/chat/completions", ChatBody({Message("user", "Hi")}, 4, false)).status, 200);
  // A Content-Length that is no count is told so (it read as a huge one: 413).
  for (const char* length : {"-5", "12abc", "99999999999999999999999"}) {
    const int fd = ConnectLoopback(coordinator_.port("http"));
    ASSERT_GE(fd, 0);
    const std::string req = absl::StrCat(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer key-a\r\n"
        "Connection: close\r\nContent-Length: ",
        length, "\r\n\r\n");
    ASSERT_EQ(send(fd, req.data(), req.size(), MSG_NOSIGNAL), static_cast<ssize_t>(req.size()));
    std::string response;
    char buf[4096];
    for (ssize_t n; (n = recv(fd, buf, sizeof(buf), 0)) > 0;)
      response.append(buf, static_cast<size_t>(n));
    close(fd);
    EXPECT_EQ(response.rfind("HTTP/1.1 400", 0), 0u) << length << ": " << response;
    EXPECT_NE(response.find("\"param\":\"Content-Length\""), std::string::npos) << response;
    EXPECT_NE(response.find("is not a byte count"), std::string::npos) << response;
  }
}

// 100 clients that send half a request and wait (slow or stalled clients: a connection holds
// its thread while open) keep no one else waiting. On a pool of 64 threads the API answered no
// one until they left (found by probing).
TEST_F(OpenAiHttpTest, StalledConnectionsKeepNoOneElseWaiting) {
  std::vector<int> stalled;
  for (int i = 0; i < 100; ++i) {
    const int fd = ConnectLoopback(coordinator_.port("http"));
    ASSERT_GE(fd, 0);
    const std::string half = "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n";
    ASSERT_EQ(send(fd, half.data(), half.size(), MSG_NOSIGNAL), static_cast<ssize_t>(half.size()));
    stalled.push_back(fd);
  }
  httplib::Client other("127.0.0.1", coordinator_.port("http"));
  other.set_read_timeout(3, 0);  // the stalled ones wait 5 s for their next byte
  const HttpReply health = Send(other, "GET", "/health", "", "");
  EXPECT_EQ(health.status, 200) << "answered beside 100 stalled connections";
  const HttpReply chat = Send(
      other, "POST", "/v1/chat/completions",
      R"({"messages":[{"role":"user","content":"Once upon a time"}],"max_tokens":4})", "key-a");
  EXPECT_EQ(chat.status, 200) << chat.body;
  for (const int fd : stalled) close(fd);
}

TEST_F(OpenAiHttpTest, BadRequestsGetOpenAIErrorsNamingTheField) {
  struct Case {
    std::string body;
    std::string key;
    httplib::Headers headers;
    int status;
    Json param;
    std::string message;  // a part of the message
  };
  const std::vector<Json> hi = {Message("user", "Hi")};
  const Case cases[] = {
      {ChatBody(hi, 4, false, R"("temperature": 2.5)"),
       "key-a",
       {},
       400,
       "temperature",
       "temperature: must be in [0, 2], got 2.5"},
      {ChatBody(hi, 4, false, R"("frequency_penalty": 2.5)"),
       "key-a",
       {},
       400,
       "frequency_penalty",
       "must be in [-2, 2], got 2.5"},
      {ChatBody(hi, 100000, false), "key-a", {}, 400, "max_tokens", "must be in [1, 512]"},
      {R"({"messages": [{"role": "user", "content": "Hi"}], "top_p": 0})",
       "key-a",
       {},
       400,
       "top_p",
       "must be in (0, 1], got 0"},
      {R"({"messages": [{"role": "user", "content": "Hi")",
       "key-a",
       {},
       400,
       nullptr,
       "not valid JSON"},
      {R"({"messages": [{"role": "assistant", "content": "Hi"}]})",
       "key-a",
       {},
       400,
       "messages[0].role",
       "the last message must be the user's"},
      {R"({"messages": [{"role": "user", "content": ")" + std::string(4001, 'x') + R"("}]})",
       "key-a",
       {},
       400,
       "messages[0].content",
       "4001 bytes; at most 4000"},
      {ChatBody(hi, 4, false, R"("model": "gpt-4")"),
       "key-a",
       {},
       404,
       "model",
       "no worker serves \"gpt-4\"; served: \"stories260K.bin\""},
      {ChatBody(hi, 4, false),
       "key-a",
       {{"X-Session-Id", "s-nope"}},
       404,
       "session_id",
       "no session \"s-nope\""},
      {ChatBody(hi, 4, false, R"("session_id": "s-a")"),
       "key-a",
       {{"X-Session-Id", "s-b"}},
       400,
       "session_id",
       "name different sessions"},
      {ChatBody(hi, 4, false), "wrong-key", {}, 401, "authorization", "unknown API key"},
      {ChatBody(hi, 4, false), "", {}, 401, "authorization", "missing"},
  };
  for (const Case& c : cases) {
    const HttpReply r = Post("/v1/chat/completions", c.body, c.key, c.headers);
    EXPECT_EQ(r.status, c.status) << c.body.substr(0, 200) << " -> " << r.body;
    const Json e = r.JsonBody()["error"];
    EXPECT_EQ(e["param"], c.param) << r.body;
    EXPECT_NE(e["message"].get<std::string>().find(c.message), std::string::npos) << r.body;
    EXPECT_TRUE(e.contains("type") && e.contains("code")) << r.body;
  }
  EXPECT_EQ(Send(*http_, "GET", "/v1/models", "", "").status, 401);
  const HttpReply wrong_method = Send(*http_, "GET", "/v1/chat/completions", "", "key-a");
  EXPECT_EQ(wrong_method.status, 405);
  EXPECT_EQ(wrong_method.Header("Allow"), "POST");
  EXPECT_EQ(wrong_method.JsonBody()["error"]["message"],
            "GET /v1/chat/completions: method not allowed; use POST");
  EXPECT_EQ(Send(*http_, "GET", "/v1/models/", "", "key-a").status, 404)
      << "the right method on no route is 404, not 405";
  const HttpReply no_route = Send(*http_, "GET", "/v1/chat/nothing", "", "key-a");
  EXPECT_EQ(no_route.status, 404);
  EXPECT_EQ(no_route.JsonBody()["error"]["message"], "no route GET /v1/chat/nothing");
  // curl -d sends a form's Content-Type: its JSON body is read whole like any other (cpp-httplib
  // read a form's body up to 8 KiB only, and the request was refused 413 past that).
  const HttpReply form =
      Post("/v1/chat/completions", ChatBody({Message("user", std::string(9000, 'x'))}, 4, false),
           "key-a", {{"Content-Type", "application/x-www-form-urlencoded"}});
  EXPECT_EQ(form.status, 400) << form.body;
  EXPECT_NE(form.JsonBody()["error"]["message"].get<std::string>().find(
                "messages[0].content: 9000 bytes; at most"),
            std::string::npos)
      << form.body;
  // The scheme's name is case-insensitive.
  httplib::Headers lower = {{"Authorization", "bearer key-a"}};
  EXPECT_EQ(Send(*http_, "GET", "/v1/models", "", "", lower).status, 200);
  // Two keys: the tenant would depend on their order.
  httplib::Headers two = {{"Authorization", "Bearer key-a"}, {"Authorization", "Bearer key-b"}};
  const HttpReply twice = Send(*http_, "GET", "/v1/models", "", "", two);
  EXPECT_EQ(twice.status, 401) << twice.body;
  EXPECT_EQ(twice.JsonBody()["error"]["message"], "authorization: given 2 times; send one key");

  // A session is its tenant's: another key finds nothing.
  const HttpReply mine = Post("/v1/chat/completions", ChatBody(hi, 4, false));
  ASSERT_EQ(mine.status, 200) << mine.body;
  const HttpReply theirs = Post("/v1/chat/completions", ChatBody(hi, 4, false), "key-b",
                                {{"X-Session-Id", mine.Header("X-Session-Id")}});
  EXPECT_EQ(theirs.status, 404) << theirs.body;
  // The refused requests stored nothing: the session took its one turn only.
  EXPECT_EQ(GetSession(mine.Header("X-Session-Id")).messages_size(), 2);
}

// A request naming no session is given a new one; refused (by the coordinator or by the
// worker), it leaves none behind (an empty session would count against --max-sessions, and
// a client retrying a bad request would fill the tenant's quota) and names none.
TEST_F(OpenAiHttpTest, ARefusedRequestLeavesNoNewSessionBehind) {
  const int before = SessionCount();
  const std::vector<Json> hi = {Message("user", "Hi")};
  const std::string too_long(3900, 'x');  // within the message limit, past the context
  for (const std::string& body :
       {ChatBody(hi, 4, false, R"("top_k": 100000)"),             // the worker's limit
        ChatBody(hi, 4, true, R"("logit_bias": {"100000": 1})"),  // past the vocabulary
        ChatBody({Message("user", too_long)}, 4, false)}) {
    const HttpReply r = Post("/v1/chat/completions", body);
    EXPECT_EQ(r.status, 400) << r.body;
    EXPECT_EQ(r.Header("X-Session-Id"), "") << "names no session: " << r.body;
  }
  EXPECT_EQ(SessionCount(), before) << "no session was left behind";
  const HttpReply ok = Post("/v1/chat/completions", ChatBody(hi, 2, false));
  ASSERT_EQ(ok.status, 200) << ok.body;
  EXPECT_EQ(SessionCount(), before + 1);
}

// A prompt past the context is refused naming the request's own field: a completion's
// "prompt" (the worker's word, "messages", is the chat's field only).
TEST_F(OpenAiHttpTest, APromptPastTheContextIsRefusedNamingItsField) {
  const std::string too_long(3900, 'x');
  const HttpReply chat =
      Post("/v1/chat/completions", ChatBody({Message("user", too_long)}, 4, false));
  ASSERT_EQ(chat.status, 400) << chat.body;
  EXPECT_EQ(Json::parse(chat.body)["error"]["param"], "messages") << chat.body;
  const HttpReply completion =
      Post("/v1/completions", Json{{"prompt", too_long}, {"max_tokens", 4}}.dump());
  ASSERT_EQ(completion.status, 400) << completion.body;
  const Json error = Json::parse(completion.body)["error"];
  EXPECT_EQ(error["param"], "prompt") << completion.body;
  EXPECT_EQ(error["message"].get<std::string>().rfind("prompt: the transcript is ", 0), 0u)
      << completion.body;
  EXPECT_NE(error["message"].get<std::string>().find("its reply needs at least one more"),
            std::string::npos)
      << completion.body;
}

// Flags recall serve cannot run with end it with status 2 (a usage error) naming the flag,
// also those its worker checks (it said "the worker did not start ... (status 512)", status
// 1) and those checked once the worker runs; no worker is left behind.
TEST(OpenAiHttpServeTest, RecallServeExitsTwoNamingAFlagItCannotRunWith) {
  RECALL_REQUIRE_SHARED_FILE(kModel);
  const std::string dir = testing::MakeTempDir("serve_flags");
  const std::pair<std::string, std::string> cases[] = {
      {"--tp 3", "--tp: 3 does not divide the model's 8 query heads"},
      {"--listen 127.0.0.1:99999", "--listen: expected HOST:PORT (port in [0, 65535])"},
      {"--port-file " + dir + "/missing/ports", "--port-file: cannot create"},
  };
  for (const auto& [flag, message] : cases) {
    const testing::Exit e = testing::RunToExit(
        std::string(RECALL_CLI_BINARY) + " serve --model " + testing::SharedPath(kModel) +
        " --tokenizer " + testing::SharedPath(kTokenizer) + " --data-dir " + dir +
        " --listen 127.0.0.1:0 --http-listen off --threads 1 " + flag);
    EXPECT_EQ(e.code, 2) << flag << ": " << e.output;
    EXPECT_NE(e.output.find(message), std::string::npos) << flag << ": " << e.output;
  }
  const testing::Exit workers = testing::RunToExit("pgrep -f '[r]ecall-worker.*" + dir + "'");
  EXPECT_NE(workers.code, 0) << "a worker was left running: " << workers.output;
}

// The coordinator's own errors (its key file, its store) come before the worker starts: a
// user is not told them after minutes of loading a model. Here the model does not exist,
// and the error named is the coordinator's.
TEST(OpenAiHttpServeTest, RecallServeSaysTheCoordinatorsErrorsBeforeTheWorkerStarts) {
  const std::string dir = testing::MakeTempDir("serve_order");
  const testing::Exit e = testing::RunToExit(
      std::string(RECALL_CLI_BINARY) + " serve --model " + dir + "/no-model.bin --data-dir " + dir +
      " --listen 127.0.0.1:0 --http-listen off --api-keys " + dir + "/no-keys");
  EXPECT_NE(e.code, 0);
  EXPECT_NE(e.output.find("--api-keys: cannot read " + dir + "/no-keys"), std::string::npos)
      << e.output;
  EXPECT_EQ(e.output.find("no-model.bin"), std::string::npos)
      << "the worker did not start: " << e.output;
}

// Ctrl-C while the worker loads its model stops serve and the worker at once (it waited for
// the model to load: minutes for a large one). The model here is a FIFO no one writes: its
// load never ends.
TEST(OpenAiHttpServeTest, RecallServeStopsAtOnceWhileTheWorkerLoads) {
  RECALL_REQUIRE_SHARED_FILE(kTokenizer);
  const std::string dir = testing::MakeTempDir("serve_loading");
  ASSERT_EQ(mkfifo((dir + "/model.bin").c_str(), 0600), 0);
  const std::string workers = "pgrep -f '[r]ecall-worker.*" + dir + "'";
  // serve in the background; once its worker runs, Ctrl-C; its exit status (within 20 s).
  const testing::Exit e = testing::RunToExit(
      "bash -c '" + std::string(RECALL_CLI_BINARY) + " serve --model " + dir +
      "/model.bin --tokenizer " + testing::SharedPath(kTokenizer) +
      " --listen 127.0.0.1:0 --http-listen off --data-dir " + dir +
      " & p=$!; for i in $(seq 200); do pgrep -f \"[r]ecall-worker.*" + dir +
      "\" > /dev/null && break; sleep 0.05; done; kill -INT $p; "
      "for i in $(seq 400); do kill -0 $p 2> /dev/null || break; sleep 0.05; done; "
      "kill -0 $p 2> /dev/null && { echo still running; kill -9 $p; }; wait $p; echo rc=$?'");
  EXPECT_NE(e.output.find("stopped while the worker was loading its model"), std::string::npos)
      << e.output;
  EXPECT_NE(e.output.find("rc=0"), std::string::npos) << e.output;
  EXPECT_EQ(e.output.find("still running"), std::string::npos) << e.output;
  EXPECT_NE(testing::RunToExit(workers).code, 0) << "no worker left";
}

// `recall serve` on stories260K (one thread, a 16M pool), its HTTP API on `http_listen`.
bool StartServe(ServerProcess& serve, const std::string& dir, const std::string& http_listen,
                std::string* error, std::vector<std::string> more = {}) {
  std::vector<std::string> args = {"serve",
                                   "--model",
                                   testing::SharedPath(kModel),
                                   "--tokenizer",
                                   testing::SharedPath(kTokenizer),
                                   "--listen",
                                   "127.0.0.1:0",
                                   "--http-listen",
                                   http_listen,
                                   "--data-dir",
                                   dir,
                                   "--threads",
                                   "1",
                                   "--kv-cache-bytes",
                                   "16M"};
  args.insert(args.end(), more.begin(), more.end());
  return serve.Start(RECALL_CLI_BINARY, args, dir, error, std::chrono::seconds(120));
}

// recall serve killed hard (SIGKILL: no shutdown of its own) takes its worker with it: the
// worker holds the KV pool (a GPU's memory), and an orphan kept it for good.
TEST(OpenAiHttpServeTest, AServeKilledHardLeavesNoWorkerBehind) {
  RECALL_REQUIRE_SHARED_FILE(kModel);
  const std::string dir = testing::MakeTempDir("serve_killed");
  ServerProcess serve;
  std::string error;
  ASSERT_TRUE(StartServe(serve, dir, "off", &error)) << error;
  const std::string workers = "pgrep -f '[r]ecall-worker.*" + dir + "'";
  ASSERT_EQ(testing::RunToExit(workers).code, 0) << "the worker runs";
  serve.Kill();
  bool gone = false;
  for (int i = 0; i < 100 && !gone; ++i) {
    gone = testing::RunToExit(workers).code != 0;
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(gone) << "the worker outlived its serve by 10 s";
  if (!gone) testing::RunToExit("pkill -9 -f '[r]ecall-worker.*" + dir + "'");
}

TEST(OpenAiHttpServeTest, RecallServeServesTheApiAndPrintsItsAddress) {
  RECALL_REQUIRE_SHARED_FILE(kModel);
  const std::string dir = testing::MakeTempDir("openai_serve");
  ServerProcess serve;
  std::string error;
  ASSERT_TRUE(StartServe(serve, dir, "127.0.0.1:0", &error, {"--worker-metrics-port", "0"}))
      << error;
  ASSERT_GT(serve.port("http"), 0);
  httplib::Client client("127.0.0.1", serve.port("http"));
  client.set_read_timeout(60, 0);
  const HttpReply r = Send(client, "POST", "/v1/chat/completions",
                           ChatBody({Message("user", "Once upon a time")}, 4, false), /*key=*/"");
  EXPECT_EQ(r.status, 200) << "no keys: every caller is the default tenant; " << r.body;
  // The worker's metrics (its KV blocks and turns), on the port the port file names.
  ASSERT_GT(serve.port("worker-metrics"), 0);
  httplib::Client metrics("127.0.0.1", serve.port("worker-metrics"));
  const httplib::Result m = metrics.Get("/metrics");
  ASSERT_TRUE(m) << "no worker metrics";
  EXPECT_NE(m->body.find("recall_worker_turns_total"), std::string::npos) << m->body;
  EXPECT_NE(m->body.find("recall_worker_kv_blocks"), std::string::npos) << m->body;
  // A second serve on that HTTP port is refused at start: it listened beside the first
  // (SO_REUSEPORT) and took half its requests into another session store.
  const std::string other = testing::MakeTempDir("openai_serve_taken");
  const testing::Exit taken = testing::RunToExit(
      absl::StrCat(RECALL_CLI_BINARY, " serve --model ", testing::SharedPath(kModel),
                   " --tokenizer ", testing::SharedPath(kTokenizer),
                   " --listen 127.0.0.1:0 --http-listen 127.0.0.1:", serve.port("http"),
                   " --data-dir ", other, " --threads 1 --kv-cache-bytes 16M"),
      60);
  EXPECT_NE(taken.code, 0) << taken.output;
  EXPECT_NE(taken.output.find("cannot listen on 127.0.0.1:" + std::to_string(serve.port("http"))),
            std::string::npos)
      << taken.output;
}

class OpenAiHttpTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!testing::HaveOpenssl()) GTEST_SKIP() << "no openssl";
    // A refused handshake closes the connection under the client's next write: without this
    // the client's write would kill the test with SIGPIPE (cpp-httplib's client leaves it on).
    signal(SIGPIPE, SIG_IGN);
    dir_ = testing::MakeTempDir("openai_tls");
    ASSERT_TRUE(testing::MakeTestCertificates(dir_)) << "openssl failed";
  }

  void Start(bool mtls) {
    std::vector<std::string> args = {
        "--listen", "127.0.0.1:0", "--http-listen",      "127.0.0.1:0", "--data-dir",
        dir_,       "--tls-cert",  dir_ + "/server.pem", "--tls-key",   dir_ + "/server.key"};
    if (mtls) {
      args.push_back("--tls-client-ca");
      args.push_back(dir_ + "/ca.pem");
    }
    std::string error;
    ASSERT_TRUE(coordinator_.Start(RECALL_COORDINATOR_BINARY, args, dir_, &error)) << error;
  }

  // GET /v1/models over HTTPS trusting `ca`, with the client certificate when `with_cert`.
  int Models(const std::string& ca, bool with_cert) {
    std::unique_ptr<httplib::SSLClient> client =
        with_cert ? std::make_unique<httplib::SSLClient>("localhost", coordinator_.port("http"),
                                                         dir_ + "/client.pem", dir_ + "/client.key")
                  : std::make_unique<httplib::SSLClient>("localhost", coordinator_.port("http"));
    client->set_ca_cert_path((dir_ + "/" + ca).c_str());
    client->enable_server_certificate_verification(true);
    client->set_connection_timeout(20, 0);  // the library's default is 300 s
    client->set_read_timeout(20, 0);
    client->set_write_timeout(20, 0);
    httplib::Result r = client->Get("/v1/models");
    return r ? r->status : 0;
  }

  std::string dir_;
  ServerProcess coordinator_;
};

TEST_F(OpenAiHttpTlsTest, HttpsAcceptsClientsThatTrustTheCaOnly) {
  Start(/*mtls=*/false);
  EXPECT_EQ(Models("ca.pem", false), 200);
  EXPECT_EQ(Models("other.pem", false), 0) << "a client that does not trust the CA";
  httplib::Client plain("127.0.0.1", coordinator_.port("http"));
  httplib::Result r = plain.Get("/v1/models");
  EXPECT_TRUE(!r || r->status != 200) << "plain HTTP on the HTTPS port";
}

TEST_F(OpenAiHttpTlsTest, MutualTlsRequiresAClientCertificate) {
  Start(/*mtls=*/true);
  EXPECT_EQ(Models("ca.pem", true), 200);
  EXPECT_EQ(Models("ca.pem", false), 0);
}

class OpenAiHttpTenantLimitTest : public OpenAiHttpCancelTest {
 protected:
  std::vector<std::string> ExtraCoordinatorFlags() const override {
    return {"--max-running-per-tenant", "1"};
  }
};

// A tenant at --max-running-per-tenant (here the one tenant "default") gets 429 with a
// Retry-After, and its refused new conversation leaves no session; once its turn ended it is
// served again. The first reply runs for seconds after its first text (200 tokens at tens of
// ms each), the refused requests take milliseconds.
TEST_F(OpenAiHttpTenantLimitTest, ATenantAtItsLimitGets429AndNoNewSession) {
  httplib::Client client("127.0.0.1", coordinator_.port("http"));
  client.set_read_timeout(120, 0);
  httplib::Client other("127.0.0.1", coordinator_.port("http"));
  other.set_read_timeout(120, 0);
  HttpReply chat, completion;
  int sessions_then = -1;
  bool asked = false;
  const HttpReply first =
      Send(client, "POST", "/v1/chat/completions",
           ChatBody({Message("user", "Once upon a time")}, 200, true), "", {},
           [&](const std::string& so_far) {
             if (asked || so_far.find("\"content\":\"", 60) == std::string::npos) return true;
             asked = true;
             chat = Send(other, "POST", "/v1/chat/completions",
                         ChatBody({Message("user", "Tom went out")}, 4, false), "");
             completion =
                 Send(other, "POST", "/v1/completions", R"({"prompt": "x", "max_tokens": 2})", "");
             grpc::ClientContext ctx;
             v1::ListSessionsResponse page;
             if (ChatStub()->ListSessions(&ctx, v1::ListSessionsRequest(), &page).ok()) {
               sessions_then = page.sessions_size();
             }
             return true;
           });
  ASSERT_EQ(first.status, 200) << first.body;
  ASSERT_TRUE(asked) << "no text came: " << first.body;
  EXPECT_NE(first.body.find("\"finish_reason\":\"length\""), std::string::npos)
      << "the reply ran its 200 tokens, past the refused requests";
  for (const HttpReply* r : {&chat, &completion}) {
    EXPECT_EQ(r->status, 429) << r->body;
    EXPECT_EQ(r->Header("Retry-After"), "1") << r->body;
    EXPECT_EQ(r->Header("x-should-retry"), "true") << r->body;
    EXPECT_NE(r->body.find("the limit is 1 at once"), std::string::npos) << r->body;
  }
  EXPECT_EQ(sessions_then, 1) << "only the running conversation's session";
  const HttpReply after = Send(client, "POST", "/v1/chat/completions",
                               ChatBody({Message("user", "Tom went out")}, 4, false), "");
  EXPECT_EQ(after.status, 200) << after.body;
}

TEST_F(OpenAiHttpCancelTest, AClientLeavingMidStreamCancelsTheWorkersTurn) {
  // Up to 200 tokens at tens of ms each; the client hangs up after the first text.
  httplib::Client client("127.0.0.1", coordinator_.port("http"));
  client.set_read_timeout(120, 0);
  const int64_t total = Load().kv_blocks_total();
  ASSERT_GT(total, 0);
  std::chrono::steady_clock::time_point left;
  const HttpReply r =
      Send(client, "POST", "/v1/chat/completions",
           ChatBody({Message("user", "Once upon a time")}, 200, true), "", {},
           [&](const std::string& so_far) {
             // The role chunk and one with text, both whole.
             const size_t text = so_far.find("\"content\":\"", 60);
             if (text == std::string::npos || so_far.find("\n\n", text) == std::string::npos) {
               return true;
             }
             left = std::chrono::steady_clock::now();
             return false;  // hang up
           });
  ASSERT_EQ(r.status, 200);
  ASSERT_NE(left, std::chrono::steady_clock::time_point()) << "no text arrived: " << r.body;
  const std::string id = r.Header("X-Session-Id");

  // Ask the worker back to back (no sleeps) until its turn is gone; give up after 10 s.
  double seconds = -1;
  v1::LoadReport load;
  while (std::chrono::steady_clock::now() - left < std::chrono::seconds(10)) {
    load = Load();
    if (load.active_turns() == 0 && load.queued_turns() == 0 && load.kv_blocks_free() == total) {
      seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - left).count();
      break;
    }
  }
  ASSERT_GE(seconds, 0) << "10 s after the client left the worker still has " << load.active_turns()
                        << " active turns";
  RecordProperty("seconds_from_hangup_to_free_worker", std::to_string(seconds));
  EXPECT_LT(seconds, 3.0) << "the next write fails, the runner cancels, the worker aborts";

  // The coordinator marks the turn interrupted once the runner reported the cancel (after the
  // worker let go of the turn: wait for it, bounded), keeping the part of the reply that was
  // sent; the session then takes its next turn.
  const v1::Session s = WaitUntilStored(id, 2);
  ASSERT_EQ(s.messages_size(), 2) << "the user message and the partial reply";
  EXPECT_EQ(s.messages(1).state(), v1::TURN_STATE_INTERRUPTED);
  EXPECT_FALSE(s.messages(1).content().empty()) << "the text the client was sent is kept";
  const HttpReply again =
      Send(client, "POST", "/v1/chat/completions",
           ChatBody({Message("user", "Once upon a time")}, 2, false), "", {{"X-Session-Id", id}});
  EXPECT_EQ(again.status, 200) << again.body;
}

// A client that hangs up while its long prompt is read: the stream began (the role chunk)
// a second into the prefill, and a comment follows every second until the first token, so the
// failed write tells the coordinator, which cancels the turn; the worker lets it go long
// before the prefill would have ended. It held the session and the worker until the first
// token (or 15 s, the keep-alive), however long the prefill took.
TEST_F(OpenAiHttpCancelTest, AClientLeavingDuringALongPrefillCancelsTheTurnThen) {
  httplib::Client client("127.0.0.1", coordinator_.port("http"));
  client.set_read_timeout(120, 0);
  int count = 400;  // words: about 1500 tokens
  const auto prompt = [&count](const std::string& first) {
    std::string words = first;
    for (int i = 0; i < count; ++i) words += " word" + std::to_string(i);
    return std::vector<Json>{Message("user", words)};
  };
  // How long this prompt's prefill takes here (one thread); on a faster machine, a longer
  // prompt (up to about 7900 of the model's 8192 tokens) makes it at least 4 s.
  auto start = std::chrono::steady_clock::now();
  double prefill = 0;
  for (;;) {
    start = std::chrono::steady_clock::now();
    const HttpReply whole = Send(client, "POST", "/v1/chat/completions",
                                 ChatBody(prompt("A" + std::to_string(count)), 1, false), "");
    ASSERT_EQ(whole.status, 200) << whole.body;
    prefill = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (prefill >= 4 || count >= 1800) break;
    count = std::min(1800, static_cast<int>(count * std::max(1.5, 6 / prefill)));
  }
  if (prefill < 4) GTEST_SKIP() << "the prefill takes " << prefill << " s here: too fast to tell";

  start = std::chrono::steady_clock::now();
  std::string opening;
  const HttpReply r = Send(client, "POST", "/v1/chat/completions", ChatBody(prompt("B"), 1, true),
                           "", {}, [&](const std::string& so_far) {
                             opening = so_far;
                             return false;  // hang up at the stream's first bytes
                           });
  const double began =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(opening.find("data: "), 0u) << "the role chunk: " << opening;
  EXPECT_LT(began, prefill / 2) << "the stream began before the first token";
  double freed = -1;
  while (std::chrono::steady_clock::now() - start < std::chrono::seconds(60)) {
    const v1::LoadReport load = Load();
    if (load.active_turns() == 0 && load.queued_turns() == 0) {
      freed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_GE(freed, 0) << "the worker still runs the turn 60 s on";
  RecordProperty("prefill_seconds", std::to_string(prefill));
  RecordProperty("seconds_to_free_worker", std::to_string(freed));
  EXPECT_LT(freed, prefill * 0.75)
      << "the turn was cancelled during its prefill (" << prefill << " s alone)";
}

// A stop (SIGTERM: a rolling restart) of the coordinator or of the worker while a reply
// streams. The coordinator cut the stream at its next token ("the coordinator is shutting
// down"), and the worker aborted the turn at once, though the Helm chart gives pods 30 s to
// end. Running turns now end first (--shutdown-grace): the reply streams whole; a turn sent
// meanwhile is 503, retryable (another replica or worker takes it), and the coordinator's
// /health says unavailable; the process exits once the turn has ended.
void StopMidStreamLetsTheReplyEndFirst(ServerProcess& stopped, int http_port, int metrics_port,
                                       bool coordinator) {
  httplib::Client client("127.0.0.1", http_port);
  client.set_read_timeout(120, 0);
  const std::vector<Json> asked = {Message("user", "Once upon a time")};
  const HttpReply reference =
      Send(client, "POST", "/v1/chat/completions", ChatBody(asked, 40, false), "");
  ASSERT_EQ(reference.status, 200) << reference.body;
  HttpReply during, health;
  std::string created_before, created_after;
  std::thread probe;
  const HttpReply r = Send(client, "POST", "/v1/chat/completions", ChatBody(asked, 40, true), "",
                           {}, [&](const std::string& so_far) {
                             const size_t text = so_far.find("\"content\":\"", 60);
                             if (probe.joinable() || text == std::string::npos) return true;
                             kill(stopped.pid(), SIGTERM);
                             probe = std::thread([&] {
                               std::this_thread::sleep_for(std::chrono::milliseconds(300));
                               httplib::Client other("127.0.0.1", http_port);
                               created_before = testing::MetricLine(
                                   metrics_port, "recall_coordinator_sessions_created_total");
                               during = Send(other, "POST", "/v1/chat/completions",
                                             ChatBody({Message("user", "Hello")}, 4, false), "");
                               created_after = testing::MetricLine(
                                   metrics_port, "recall_coordinator_sessions_created_total");
                               health = Send(other, "GET", "/health", "", "");
                             });
                             return true;
                           });
  ASSERT_TRUE(probe.joinable()) << "no text came: " << r.body;
  probe.join();
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(StreamedText(r.body), ReplyText(reference)) << r.body;
  EXPECT_EQ(Events(r.body).back(), "[DONE]");
  EXPECT_EQ(during.status, 503) << during.body;
  EXPECT_NE(during.body.find("shutting down"), std::string::npos) << during.body;
  EXPECT_EQ(during.Header("x-should-retry"), "true");
  if (coordinator) {
    EXPECT_EQ(health.status, 503) << health.body;
    // Refused before a session was made for it (it names none), not made and deleted again.
    EXPECT_FALSE(created_before.empty());
    EXPECT_EQ(created_after, created_before);
  }
  std::optional<int> exit;
  for (int i = 0; i < 1000 && !exit.has_value(); ++i) {
    exit = stopped.Reap();
    if (!exit.has_value()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(exit.has_value()) << "still running 10 s after its turn ended";
  EXPECT_TRUE(WIFEXITED(*exit) && WEXITSTATUS(*exit) == 0) << *exit;
}

TEST_F(OpenAiHttpCancelTest, ACoordinatorStoppedMidStreamLetsTheReplyEndFirst) {
  StopMidStreamLetsTheReplyEndFirst(coordinator_, coordinator_.port("http"),
                                    coordinator_.port("metrics"), true);
}

TEST_F(OpenAiHttpCancelTest, AWorkerStoppedMidStreamLetsTheReplyEndFirst) {
  StopMidStreamLetsTheReplyEndFirst(worker_, coordinator_.port("http"),
                                    coordinator_.port("metrics"), false);
}

// "Stop generating" in a client that names no session: the second reply is stopped (the
// client hangs up mid-stream), and the list is sent again. It continues the same session,
// whose worker kept the cache of the first turn (the aborted turn gave back what it fed):
// the prompt's first turn is cached. It used to go to a new session (the stored interrupted
// reply made the old one look "gone on"), and rebuild.
// Stopped, then sent again at once (a chat UI's stop, then regenerate), naming no session:
// the coordinator may not have seen the hang-up yet (it does at its next write), so the
// session's turn still runs. It is waited for, and the list continues that session with its
// cache (it went to a new, cold session).
TEST_F(OpenAiHttpCancelTest, AListSentAgainTheMomentItsReplyIsStoppedContinuesItsSession) {
  httplib::Client client("127.0.0.1", coordinator_.port("http"));
  client.set_read_timeout(120, 0);
  std::vector<Json> list = {Message("user", "Once upon a time")};
  std::string id, reply;
  ASSERT_NO_FATAL_FAILURE(FirstTurn(client, list, &id, &reply));
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    list.push_back(Message("assistant", reply));
    list.push_back(Message("user", round == 0 ? "Tell me more" : "And then?"));
    const HttpReply stopped = HangUpAfterFirstText(client, ChatBody(list, 200, true));
    ASSERT_FALSE(stopped.body.empty()) << "no text arrived";
    const HttpReply again = SendAgainToContinue(client, list, id);
    ASSERT_EQ(again.status, 200) << again.body;
    reply = Json::parse(again.body)["choices"][0]["message"]["content"];
  }
}

TEST_F(OpenAiHttpCancelTest, AListSentAgainAfterAStoppedReplyContinuesItsSession) {
  httplib::Client client("127.0.0.1", coordinator_.port("http"));
  client.set_read_timeout(120, 0);
  const HttpReply first = Send(client, "POST", "/v1/chat/completions",
                               ChatBody({Message("user", "Once upon a time")}, 4, false), "");
  ASSERT_EQ(first.status, 200) << first.body;
  const std::string id = first.Header("X-Session-Id");
  const Json one = Json::parse(first.body);
  const std::vector<Json> list = {
      Message("user", "Once upon a time"),
      Message("assistant", one["choices"][0]["message"]["content"].get<std::string>()),
      Message("user", "Tell me more")};
  const HttpReply stopped = HangUpAfterFirstText(client, ChatBody(list, 200, true));
  ASSERT_FALSE(stopped.body.empty()) << "no text arrived";
  EXPECT_EQ(stopped.Header("X-Session-Id"), id);
  // Once the coordinator stored the stopped reply (interrupted), the list comes again.
  v1::Session s = WaitUntilStored(id, 4);
  ASSERT_EQ(s.messages_size(), 4);
  ASSERT_EQ(s.messages(3).state(), v1::TURN_STATE_INTERRUPTED);
  const HttpReply again = SendAgainToContinue(client, list, id);
  ASSERT_EQ(again.status, 200) << again.body;
  const Json usage = Json::parse(again.body)["usage"];
  // The stopped reply gave way to this one.
  s = WaitUntilStored(id, 4);
  ASSERT_EQ(s.messages_size(), 4);
  EXPECT_EQ(s.messages(3).state(), v1::TURN_STATE_COMPLETE);

  // Stopped again; this time the client keeps the part it got and writes a new message (as
  // chat UIs do): the same session, its cache going on from before the stopped turn.
  std::vector<Json> list2 = list;
  list2.push_back(Message("assistant", s.messages(3).content()));
  list2.push_back(Message("user", "And then?"));
  const HttpReply stopped2 = HangUpAfterFirstText(client, ChatBody(list2, 200, true));
  ASSERT_FALSE(stopped2.body.empty()) << "no text arrived";
  s = WaitUntilStored(id, 6);
  ASSERT_EQ(s.messages_size(), 6);
  ASSERT_EQ(s.messages(5).state(), v1::TURN_STATE_INTERRUPTED);
  list2.push_back(Message("assistant", " The part it got"));
  list2.push_back(Message("user", "Go on"));
  const HttpReply on = Send(client, "POST", "/v1/chat/completions", ChatBody(list2, 2, false), "");
  ASSERT_EQ(on.status, 200) << on.body;
  EXPECT_EQ(on.Header("X-Session-Id"), id) << "the same session";
  const Json usage2 = Json::parse(on.body)["usage"];
  EXPECT_GT(usage2["prompt_tokens_details"]["cached_tokens"].get<int>(),
            usage["prompt_tokens_details"]["cached_tokens"].get<int>())
      << usage2.dump();

  // A stopped request that brought several messages (an exchange the client wrote, then a
  // question), sent again: still cached past the stopped turn (its first exchange is kept in
  // the transcript, and the worker catches up on it).
  std::vector<Json> list3 = list2;
  list3.push_back(Message(
      "assistant", Json::parse(on.body)["choices"][0]["message"]["content"].get<std::string>()));
  list3.push_back(Message("user", "One more"));
  list3.push_back(Message("assistant", "The dog ran."));
  list3.push_back(Message("user", "Then?"));
  const HttpReply stopped3 = HangUpAfterFirstText(client, ChatBody(list3, 200, true));
  ASSERT_FALSE(stopped3.body.empty()) << "no text arrived";
  s = WaitUntilStored(id, 12);
  ASSERT_EQ(s.messages_size(), 12);
  ASSERT_EQ(s.messages(11).state(), v1::TURN_STATE_INTERRUPTED);
  const HttpReply third =
      Send(client, "POST", "/v1/chat/completions", ChatBody(list3, 2, false), "");
  ASSERT_EQ(third.status, 200) << third.body;
  EXPECT_EQ(third.Header("X-Session-Id"), id) << "the same session";
  const Json usage3 = Json::parse(third.body)["usage"];
  EXPECT_GT(usage3["prompt_tokens_details"]["cached_tokens"].get<int>(),
            usage2["prompt_tokens_details"]["cached_tokens"].get<int>())
      << usage3.dump();
}

// A client that stopped reading a reply the coordinator had already written whole (into the
// connection's buffers: it completed) sends the part it read and a new message, naming no
// session: the same session goes on, rebuilt in place (the reply gives way to the part). It
// went to a new, cold session (the complete reply made the old one look "gone on"), leaving
// the old one.
TEST_F(OpenAiHttpCancelTest, APartOfACompleteReplyAndANewMessageContinueItsSession) {
  httplib::Client client("127.0.0.1", coordinator_.port("http"));
  client.set_read_timeout(120, 0);
  std::vector<Json> list = {Message("user", "Once upon a time")};
  std::string id, first_reply;
  ASSERT_NO_FATAL_FAILURE(FirstTurn(client, list, &id, &first_reply));
  list.push_back(Message("assistant", first_reply));
  list.push_back(Message("user", "Tell me more"));
  const HttpReply second =
      Send(client, "POST", "/v1/chat/completions", ChatBody(list, 24, false), "");
  ASSERT_EQ(second.status, 200) << second.body;
  ASSERT_EQ(second.Header("X-Session-Id"), id);
  const std::string reply = Json::parse(second.body)["choices"][0]["message"]["content"];
  ASSERT_GT(reply.size(), 4u) << reply;

  list.push_back(Message("assistant", reply.substr(0, reply.size() / 2)));
  list.push_back(Message("user", "And then?"));
  const HttpReply on = Send(client, "POST", "/v1/chat/completions", ChatBody(list, 2, false), "");
  ASSERT_EQ(on.status, 200) << on.body;
  EXPECT_EQ(on.Header("X-Session-Id"), id) << "the same session";
  // Rebuilt in place as a named session's diverging tail is: the cache is kept up to the
  // whole blocks before the cut reply (a new session has none cached).
  EXPECT_GT(Json::parse(on.body)["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 0)
      << on.body;
  const v1::Session s = WaitUntilStored(id, 6);
  ASSERT_EQ(s.messages_size(), 6);
  EXPECT_EQ(s.messages(3).content(), reply.substr(0, reply.size() / 2)) << "the part it read";

  // Another text in the reply's place is another conversation: a new session.
  list[3] = Message("assistant", "Something else entirely");
  const HttpReply other =
      Send(client, "POST", "/v1/chat/completions", ChatBody(list, 2, false), "");
  ASSERT_EQ(other.status, 200) << other.body;
  EXPECT_NE(other.Header("X-Session-Id"), id);
}

// "Stop generating" in a session that evicts (LazyEviction, a budget its replies pass): the
// worker takes the stopped turn back too, keeping what its steps evicted, and its Abort's
// answer says what the turn fed, which the coordinator stores with the interrupted reply. The
// next turn continues the cache; a regenerate of it, which rebuilds the session from the
// stored transcript (the session evicts), replays the stopped turn as it ran, and replies as
// the kept cache did, to the bit of every logprob (in a run without the record, they
// differed).
TEST_F(OpenAiHttpCancelTest, AStoppedReplyOfAnEvictingSessionIsReplayedAsItRan) {
  auto chat = ChatStub();
  v1::Session created;
  {
    grpc::ClientContext ctx;
    v1::CreateSessionRequest req;
    req.mutable_cache()->set_policy("lazy");
    req.mutable_cache()->set_budget_tokens(24);
    req.mutable_cache()->set_window(8);
    const grpc::Status st = chat->CreateSession(&ctx, req, &created);
    ASSERT_TRUE(st.ok()) << st.error_message();
  }
  const httplib::Headers named = {{"X-Session-Id", created.session_id()}};
  httplib::Client client("127.0.0.1", coordinator_.port("http"));
  client.set_read_timeout(120, 0);
  const HttpReply first =
      Send(client, "POST", "/v1/chat/completions",
           ChatBody({Message("user", "Once upon a time")}, 30, false), "", named);
  ASSERT_EQ(first.status, 200) << first.body;
  const std::vector<Json> list = {
      Message("user", "Once upon a time"),
      Message("assistant",
              Json::parse(first.body)["choices"][0]["message"]["content"].get<std::string>()),
      Message("user", "Tell me more")};
  const HttpReply stopped = HangUpAfterFirstText(client, ChatBody(list, 200, true), named);
  ASSERT_FALSE(stopped.body.empty()) << "no text arrived";
  v1::Session s = WaitUntilStored(created.session_id(), 4);
  ASSERT_EQ(s.messages_size(), 4);
  ASSERT_EQ(s.messages(3).state(), v1::TURN_STATE_INTERRUPTED);

  const HttpReply again =
      Send(client, "POST", "/v1/chat/completions", ChatBody(list, 12, false), "", named);
  ASSERT_EQ(again.status, 200) << again.body;
  EXPECT_GT(Json::parse(again.body)["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(),
            0)
      << "continued from its cache: " << again.body;
  // The next turn from the cache (with logprobs: a cache that evicted otherwise shows in
  // them, even where the tokens agree), then the same list again: a regenerate, which in a
  // session that evicts rebuilds it from the stored transcript, the record included.
  std::vector<Json> list2 = list;
  list2.push_back(Message(
      "assistant", Json::parse(again.body)["choices"][0]["message"]["content"].get<std::string>()));
  list2.push_back(Message("user", "And then?"));
  const std::string body2 = ChatBody(list2, 12, false, "\"logprobs\":true");
  const HttpReply next = Send(client, "POST", "/v1/chat/completions", body2, "", named);
  ASSERT_EQ(next.status, 200) << next.body;
  const Json kept = Json::parse(next.body);
  EXPECT_GT(kept["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 0)
      << kept["usage"].dump();
  const HttpReply regenerated = Send(client, "POST", "/v1/chat/completions", body2, "", named);
  ASSERT_EQ(regenerated.status, 200) << regenerated.body;
  const Json rebuilt = Json::parse(regenerated.body);
  EXPECT_EQ(rebuilt["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 0)
      << "rebuilt from the transcript: " << rebuilt["usage"].dump();
  EXPECT_EQ(rebuilt["choices"][0]["message"]["content"], kept["choices"][0]["message"]["content"]);
  EXPECT_EQ(rebuilt["choices"][0]["logprobs"].dump(), kept["choices"][0]["logprobs"].dump());
  // The stopped turn gave way to the one sent again (its record went to that turn's reply),
  // and the regenerated reply replaced the kept one.
  s = WaitUntilStored(created.session_id(), 6);
  ASSERT_EQ(s.messages_size(), 6);
  for (const v1::ChatMessage& m : s.messages()) EXPECT_EQ(m.state(), v1::TURN_STATE_COMPLETE);
}

// A session deleted while its turn streams (the slow model): the turn ends NOT_FOUND saying
// so; it said UNAVAILABLE, "retryable", and that the turn was kept, though nothing was.
TEST_F(OpenAiHttpCancelTest, ASessionDeletedMidTurnEndsItNotFound) {
  auto chat = ChatStub();
  v1::Session created;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(chat->CreateSession(&ctx, v1::CreateSessionRequest(), &created).ok());
  }
  grpc::ClientContext ctx;
  v1::ConverseRequest req;
  req.set_session_id(created.session_id());
  req.set_message("Once upon a time");
  req.mutable_sampling()->set_max_tokens(400);
  auto reader = chat->Converse(&ctx, req);
  v1::ConverseEvent ev;
  ASSERT_TRUE(reader->Read(&ev));
  {
    grpc::ClientContext del;
    v1::DeleteSessionRequest d;
    d.set_session_id(created.session_id());
    v1::DeleteSessionResponse ignored;
    ASSERT_TRUE(chat->DeleteSession(&del, d, &ignored).ok());
  }
  while (reader->Read(&ev)) {
  }
  const grpc::Status st = reader->Finish();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND) << st.error_message();
  EXPECT_NE(st.error_message().find("deleted while its turn ran"), std::string::npos)
      << st.error_message();
}

// A stream silent mid-reply for --sse-keepalive gets SSE comment lines, which clients skip:
// here 2 ms, shorter than a token of this model, so they come between tokens. A stream whose
// first token takes longer than that begins without it: the role chunk, then comments. The
// data events are the reply the same request gets without streaming.
TEST_F(OpenAiHttpCancelTest, ASilentStreamGetsKeepAliveComments) {
  ServerProcess keeping;
  std::string error;
  std::filesystem::create_directories(dir_ + "/keeping");
  ASSERT_TRUE(keeping.Start(
      RECALL_COORDINATOR_BINARY,
      {"--workers", "127.0.0.1:" + std::to_string(worker_.port("grpc")), "--listen", "127.0.0.1:0",
       "--http-listen", "127.0.0.1:0", "--data-dir", dir_ + "/keeping", "--sse-keepalive", "0.002"},
      dir_, &error))
      << error;
  httplib::Client client("127.0.0.1", keeping.port("http"));
  client.set_read_timeout(120, 0);
  const HttpReply whole = Send(client, "POST", "/v1/chat/completions",
                               ChatBody({Message("user", "Once upon a time")}, 12, false), "");
  ASSERT_EQ(whole.status, 200) << whole.body;
  const HttpReply streamed = Send(client, "POST", "/v1/chat/completions",
                                  ChatBody({Message("user", "Once upon a time")}, 12, true), "");
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  EXPECT_NE(streamed.body.find("\n\n: keep-alive\n\n"), std::string::npos) << streamed.body;
  EXPECT_EQ(StreamedText(streamed.body), ReplyText(whole));
  // The prefill (one thread, SmolLM2's shape) takes longer than 2 ms: the stream began with
  // the role chunk and a comment before the first text.
  const std::vector<std::string> events = Events(streamed.body);
  ASSERT_FALSE(events.empty());
  const Json opening = Json::parse(events[0], nullptr, false);
  ASSERT_FALSE(opening.is_discarded()) << events[0];
  EXPECT_EQ(opening["choices"][0]["delta"]["role"], "assistant") << events[0];
  EXPECT_EQ(opening["choices"][0]["delta"]["content"], "") << events[0];
  EXPECT_EQ(streamed.body.find("data: "), 0u) << "the role chunk comes first";
  const size_t second = streamed.body.find("\n\n") + 2;
  EXPECT_EQ(streamed.body.find(": keep-alive", second), second)
      << "a comment follows the role chunk, before any text: " << streamed.body.substr(0, 600);
}

}  // namespace
}  // namespace recall
