// A coordinator in front of two workers serving different models (stories260K, and random
// weights of SmolLM2-135M's shape): every request runs on a worker of the model it names, a
// session keeps its model, and a request that names none is refused when several are
// served; an Idempotency-Key is replayed for its model only; max_tokens is its model's limit;
// a second model under a name in use serves nothing. A session is not made before any
// worker is known.
#include <httplib.h>

#include <string>
#include <thread>
#include <vector>

#include "common/subprocess.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "recall/v1/chat.grpc.pb.h"
#include "recall/v1/registry.grpc.pb.h"
#include "recall/v1/worker.grpc.pb.h"
#include "tests/common/test_util.h"
#include "tests/integration/openai_http_util.h"

namespace recall {
namespace {

constexpr char kSmol[] = "smollm2";  // its served name: the folder's

class TwoModelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    RECALL_REQUIRE_SHARED_FILE(kModel);
    const std::string smol = testing::SharedPath("tokenizers/smollm2");
    if (!std::filesystem::exists(smol + "/config.json")) GTEST_SKIP() << "shared data missing";
    dir_ = testing::MakeTempDir("two_models");
    std::string error;
    ASSERT_TRUE(stories_.Start(
        RECALL_WORKER_BINARY,
        {"--model", testing::SharedPath(kModel), "--tokenizer", testing::SharedPath(kTokenizer),
         "--listen", "127.0.0.1:0", "--kv-cache-bytes", "16M", "--threads", "1"},
        dir_, &error))
        << error;
    // Given as its config.json, served by its folder's name.
    ASSERT_TRUE(smol_.Start(RECALL_WORKER_BINARY,
                            {"--model", smol + "/config.json", "--random-weights", "--listen",
                             "127.0.0.1:0", "--kv-cache-bytes", "64M", "--threads", "1"},
                            dir_, &error))
        << error;
    ASSERT_TRUE(coordinator_.Start(
        RECALL_COORDINATOR_BINARY,
        {"--workers",
         "127.0.0.1:" + std::to_string(stories_.port("grpc")) +
             ",127.0.0.1:" + std::to_string(smol_.port("grpc")),
         "--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0", "--data-dir", dir_},
        dir_, &error))
        << error;
    http_ = std::make_unique<httplib::Client>("127.0.0.1", coordinator_.port("http"));
    http_->set_read_timeout(120, 0);
  }

  HttpReply Chat(const std::string& model, const std::vector<Json>& messages,
                 httplib::Headers headers = {}) {
    std::string body = ChatBody(messages, 2, false);
    if (!model.empty()) body = body.substr(0, body.size() - 1) + ",\"model\":\"" + model + "\"}";
    return Send(*http_, "POST", "/v1/chat/completions", body, "", std::move(headers));
  }

  static int Sessions(const ServerProcess& worker) {
    const v1::LoadReport load = WorkerLoad(worker);
    return load.resident_sessions() + load.offloaded_sessions();
  }

  std::string dir_;
  ServerProcess stories_, smol_, coordinator_;
  std::unique_ptr<httplib::Client> http_;
};

TEST_F(TwoModelsTest, EveryRequestRunsOnAWorkerOfTheModelItNames) {
  const std::vector<Json> hello = {Message("user", "Once upon a time")};
  for (int round = 1; round <= 3; ++round) {
    for (const std::string model : {"stories260K.bin", kSmol}) {
      const HttpReply r = Chat(model, hello);
      ASSERT_EQ(r.status, 200) << model << ": " << r.body;
      EXPECT_EQ(r.JsonBody()["model"], model);
    }
    EXPECT_EQ(Sessions(stories_), round) << "one new session a round on each worker";
    EXPECT_EQ(Sessions(smol_), round);
  }
  // One-off completions too.
  const HttpReply c = Send(*http_, "POST", "/v1/completions",
                           R"({"model":"smollm2","prompt":"Hi","max_tokens":2})", "");
  ASSERT_EQ(c.status, 200) << c.body;
  EXPECT_EQ(c.JsonBody()["model"], kSmol);
}

TEST_F(TwoModelsTest, ASessionKeepsItsModelAndARequestMustNameOne) {
  const std::vector<Json> hello = {Message("user", "Once upon a time")};
  const HttpReply none = Chat("", hello);
  EXPECT_EQ(none.status, 400) << none.body;
  EXPECT_EQ(none.JsonBody()["error"]["param"], "model") << none.body;
  EXPECT_NE(none.body.find("several models"), std::string::npos) << none.body;

  const HttpReply first = Chat(kSmol, hello);
  ASSERT_EQ(first.status, 200) << first.body;
  const std::string id = first.Header("X-Session-Id");
  std::vector<Json> list = hello;
  list.push_back(Message("assistant", first.JsonBody()["choices"][0]["message"]["content"]));
  list.push_back(Message("user", "And then?"));
  // Unnamed, a list that extends that session's, with the other model: not that session.
  const HttpReply unnamed = Chat("stories260K.bin", list);
  ASSERT_EQ(unnamed.status, 200) << unnamed.body;
  EXPECT_NE(unnamed.Header("X-Session-Id"), id);
  EXPECT_EQ(Sessions(stories_), 1);
  // Named, without a model: the session's.
  const HttpReply named = Chat("", list, {{"X-Session-Id", id}});
  ASSERT_EQ(named.status, 200) << named.body;
  EXPECT_EQ(named.JsonBody()["model"], kSmol);
  EXPECT_EQ(Sessions(stories_), 1) << "nothing more ran on the other model's worker";
  EXPECT_EQ(Sessions(smol_), 1);
  // Named, with another model: refused.
  const HttpReply other = Chat("stories260K.bin", list, {{"X-Session-Id", id}});
  EXPECT_EQ(other.status, 400) << other.body;
  EXPECT_EQ(other.JsonBody()["error"]["param"], "model") << other.body;

  // gRPC: a session made without a model is refused naming the field.
  auto chat = v1::Chat::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(coordinator_.port("grpc")),
                          grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  v1::CreateSessionRequest req;
  v1::Session made;
  const grpc::Status st = chat->CreateSession(&ctx, req, &made);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
  EXPECT_NE(st.error_message().find("model"), std::string::npos) << st.error_message();
}

// After a coordinator's restart, a session whose model's workers have not registered again
// yet is told to retry (503), not that its model is gone (404, which clients do not retry).
TEST_F(TwoModelsTest, ASessionWhoseWorkersHaveNotRegisteredAfterARestartIsToldToRetry) {
  const std::vector<Json> hello = {Message("user", "Once upon a time")};
  const HttpReply first = Chat(kSmol, hello);
  ASSERT_EQ(first.status, 200) << first.body;
  const std::string id = first.Header("X-Session-Id");
  coordinator_.Stop();
  std::string error;
  ASSERT_TRUE(coordinator_.Start(
      RECALL_COORDINATOR_BINARY,
      {"--workers", "127.0.0.1:" + std::to_string(stories_.port("grpc")), "--listen", "127.0.0.1:0",
       "--http-listen", "127.0.0.1:0", "--data-dir", dir_},
      dir_, &error))
      << error;
  http_ = std::make_unique<httplib::Client>("127.0.0.1", coordinator_.port("http"));
  // Naming the model (as the OpenAI SDKs always do) or not.
  for (const std::string model : {kSmol, ""}) {
    HttpReply again;
    for (int i = 0; i < 100; ++i) {  // once the stories worker is known
      again = Chat(model, {Message("user", "And then?")}, {{"X-Session-Id", id}});
      if (again.body.find("has registered yet") != std::string::npos) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    EXPECT_EQ(again.status, 503) << model << ": " << again.body;
    EXPECT_NE(again.JsonBody()["error"]["message"].get<std::string>().find(
                  "no worker serving \"smollm2\" (the session's model) has registered yet; "
                  "served: \"stories260K.bin\""),
              std::string::npos)
        << again.body;
    EXPECT_EQ(again.Header("x-should-retry"), "true");
  }
}

// max_tokens is checked against the limit of the model's workers (stories260K's 512,
// SmolLM2's larger), not the smallest of all: 600 was refused for SmolLM2 too.
TEST_F(TwoModelsTest, MaxTokensIsCheckedAgainstItsModelsLimit) {
  const std::vector<Json> hello = {Message("user", "Once upon a time")};
  const auto asking = [&](const std::string& model, int max_tokens, httplib::Headers headers) {
    std::string extra = R"("model":")" + model + R"(")";
    if (model.empty()) extra = R"("user":"x")";
    // Streamed, hung up at the first event: its status says whether it was taken.
    return Send(*http_, "POST", "/v1/chat/completions", ChatBody(hello, max_tokens, true, extra),
                "", std::move(headers), [](const std::string& so_far) { return so_far.empty(); });
  };
  const HttpReply smol = asking(kSmol, 600, {});
  EXPECT_EQ(smol.status, 200) << smol.body;
  const HttpReply stories = asking("stories260K.bin", 600, {});
  EXPECT_EQ(stories.status, 400) << stories.body;
  EXPECT_EQ(stories.JsonBody()["error"]["param"], "max_tokens") << stories.body;
  EXPECT_EQ(stories.JsonBody()["error"]["message"],
            "max_tokens: must be in [1, 512] for \"stories260K.bin\", got 600 (the smallest limit "
            "of its answering workers: --max-tokens-limit, or the context; not retryable)");
  // A named session's model, the request naming none: refused before anything is stored.
  const HttpReply made = Chat("stories260K.bin", hello);
  ASSERT_EQ(made.status, 200) << made.body;
  const std::string id = made.Header("X-Session-Id");
  const HttpReply named = asking("", 600, {{"X-Session-Id", id}});
  EXPECT_EQ(named.status, 400) << named.body;
  EXPECT_EQ(named.JsonBody()["error"]["param"], "max_tokens") << named.body;
  grpc::ClientContext ctx;
  v1::GetSessionRequest get;
  get.set_session_id(id);
  v1::Session session;
  auto chat = v1::Chat::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(coordinator_.port("grpc")),
                          grpc::InsecureChannelCredentials()));
  ASSERT_TRUE(chat->GetSession(&ctx, get, &session).ok());
  EXPECT_EQ(session.messages_size(), 2) << "the refused turn left nothing";
  // Past every model's limit: refused while the request is read.
  const HttpReply huge = asking(kSmol, 1 << 24, {});
  EXPECT_EQ(huge.status, 400) << huge.body;
}

// An Idempotency-Key names one request: sent again for another model, its reply is not
// replayed (nor its turn resumed) under that model's name, for chat turns and completions.
TEST_F(TwoModelsTest, AKeyIsReplayedForItsModelOnly) {
  const std::vector<Json> hello = {Message("user", "Once upon a time")};
  const httplib::Headers key = {{"Idempotency-Key", "chat-1"}};
  const HttpReply first = Chat(kSmol, hello, key);
  ASSERT_EQ(first.status, 200) << first.body;
  const HttpReply other = Chat("stories260K.bin", hello, key);
  EXPECT_EQ(other.status, 400) << other.body;
  EXPECT_EQ(other.JsonBody()["error"]["param"], "model") << other.body;
  EXPECT_EQ(other.Header("Idempotent-Replayed"), "");
  EXPECT_EQ(Sessions(stories_), 0) << "nothing ran on the other model's worker";
  const HttpReply again = Chat(kSmol, hello, key);
  ASSERT_EQ(again.status, 200) << again.body;
  EXPECT_EQ(again.Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(again.JsonBody()["choices"][0]["message"]["content"],
            first.JsonBody()["choices"][0]["message"]["content"]);

  const httplib::Headers ckey = {{"Idempotency-Key", "completion-1"}};
  const auto complete = [&](const std::string& model) {
    return Send(*http_, "POST", "/v1/completions",
                R"({"model":")" + model + R"(","prompt":"Hi","max_tokens":2})", "", ckey);
  };
  const HttpReply done = complete(kSmol);
  ASSERT_EQ(done.status, 200) << done.body;
  const HttpReply wrong = complete("stories260K.bin");
  EXPECT_EQ(wrong.status, 400) << wrong.body;
  EXPECT_EQ(wrong.JsonBody()["error"]["param"], "Idempotency-Key") << wrong.body;
  EXPECT_NE(wrong.body.find("was sent for model"), std::string::npos) << wrong.body;
  const HttpReply replayed = complete(kSmol);
  ASSERT_EQ(replayed.status, 200) << replayed.body;
  EXPECT_EQ(replayed.Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(replayed.JsonBody()["model"], kSmol);
}

// A worker serving `name`: stories260K, or a model of SmolLM2's shape with random weights.
bool StartNamedWorker(ServerProcess& w, bool stories, const std::string& name,
                      const std::string& dir, std::string* error) {
  std::vector<std::string> model =
      stories ? std::vector<std::string>{"--model",          testing::SharedPath(kModel),
                                         "--tokenizer",      testing::SharedPath(kTokenizer),
                                         "--kv-cache-bytes", "16M"}
              : std::vector<std::string>{"--model", testing::SharedPath("tokenizers/smollm2"),
                                         "--random-weights", "--kv-cache-bytes", "64M"};
  for (const char* f : {"--listen", "127.0.0.1:0", "--threads", "1", "--served-model-name"}) {
    model.push_back(f);
  }
  model.push_back(name);
  return w.Start(RECALL_WORKER_BINARY, model, dir, error);
}

// Two models under one served name: the worker read later is not used (a session failed
// over from one to the other went on with the other model's tokens, or failed with the first
// model's token ids out of the other's vocabulary).
TEST(ModelNameConflictTest, ASecondModelUnderANameInUseServesNothing) {
  RECALL_REQUIRE_SHARED_FILE(kModel);
  const std::string smol = testing::SharedPath("tokenizers/smollm2");
  if (!std::filesystem::exists(smol + "/config.json")) GTEST_SKIP() << "shared data missing";
  const std::string dir = testing::MakeTempDir("name_conflict");
  ServerProcess stories, other, coordinator;
  std::string error;
  ASSERT_TRUE(StartNamedWorker(stories, /*stories=*/true, "same", dir, &error)) << error;
  ASSERT_TRUE(StartNamedWorker(other, /*stories=*/false, "same", dir, &error)) << error;
  ASSERT_TRUE(coordinator.Start(
      RECALL_COORDINATOR_BINARY,
      {"--workers",
       "127.0.0.1:" + std::to_string(stories.port("grpc")) +
           ",127.0.0.1:" + std::to_string(other.port("grpc")),
       "--listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0", "--data-dir", dir},
      dir, &error))
      << error;
  httplib::Client http("127.0.0.1", coordinator.port("http"));
  http.set_read_timeout(60, 0);
  Json models;
  for (int i = 0; i < 100; ++i) {  // both polled: the first's Info read
    models = Send(http, "GET", "/v1/models", "", "").JsonBody();
    if (models["data"].size() == 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(models["data"].size(), 1u) << models.dump();
  EXPECT_EQ(models["data"][0]["id"], "same");
  EXPECT_EQ(models["data"][0]["context_length"], 512) << "the first listed: stories260K";
  for (int i = 0; i < 4; ++i) {
    const HttpReply r = Send(http, "POST", "/v1/chat/completions",
                             ChatBody({Message("user", "Once upon a time")}, 2, false), "");
    ASSERT_EQ(r.status, 200) << r.body;
  }
  EXPECT_EQ(WorkerLoad(stories).resident_sessions() + WorkerLoad(stories).offloaded_sessions(), 4);
  EXPECT_EQ(WorkerLoad(other).resident_sessions() + WorkerLoad(other).offloaded_sessions(), 0)
      << "nothing ran on the other model";
  // A worker registering itself hears why it gets no turn (it logged "registered", and only
  // the coordinator's log said otherwise); the used one hears nothing.
  const auto registry = v1::Registry::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string(coordinator.port("grpc")), grpc::InsecureChannelCredentials()));
  for (ServerProcess* w : {&stories, &other}) {
    grpc::ClientContext ctx;
    v1::RegisterRequest req;
    req.set_address("127.0.0.1:" + std::to_string(w->port("grpc")));
    v1::RegisterResponse resp;
    ASSERT_TRUE(registry->Register(&ctx, req, &resp).ok());
    if (w == &stories) {
      EXPECT_EQ(resp.not_used(), "");
    } else {
      EXPECT_NE(resp.not_used().find("serves \"same\" as context 8192"), std::string::npos)
          << resp.not_used();
      EXPECT_NE(resp.not_used().find("give it another --served-model-name"), std::string::npos)
          << resp.not_used();
    }
  }
}

// One worker under two addresses (localhost:P and 127.0.0.1:P in --workers) is one worker:
// /v1/models counted it twice, and a session failed over from it to itself.
TEST(ModelNameConflictTest, OneWorkerUnderTwoAddressesIsUsedOnce) {
  RECALL_REQUIRE_SHARED_FILE(kModel);
  const std::string dir = testing::MakeTempDir("same_worker");
  ServerProcess worker, coordinator;
  std::string error;
  ASSERT_TRUE(StartNamedWorker(worker, /*stories=*/true, "stories", dir, &error)) << error;
  const std::string port = std::to_string(worker.port("grpc"));
  ASSERT_TRUE(coordinator.Start(RECALL_COORDINATOR_BINARY,
                                {"--workers", "127.0.0.1:" + port + ",localhost:" + port,
                                 "--listen", "127.0.0.1:0", "--data-dir", dir},
                                dir, &error))
      << error;
  const auto registry = v1::Registry::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string(coordinator.port("grpc")), grpc::InsecureChannelCredentials()));
  const auto chat = v1::Chat::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string(coordinator.port("grpc")), grpc::InsecureChannelCredentials()));
  v1::ListModelsResponse models;
  for (int i = 0; i < 100; ++i) {  // both polled, their Info read
    grpc::ClientContext ctx;
    models.Clear();
    ASSERT_TRUE(chat->ListModels(&ctx, v1::ListModelsRequest(), &models).ok());
    if (models.models_size() == 1 && models.models(0).workers() == 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(models.models_size(), 1) << models.ShortDebugString();
  EXPECT_EQ(models.models(0).workers(), 1) << "one process";
  grpc::ClientContext ctx;
  v1::RegisterRequest req;
  req.set_address("localhost:" + port);
  v1::RegisterResponse resp;
  ASSERT_TRUE(registry->Register(&ctx, req, &resp).ok());
  EXPECT_EQ(resp.not_used(), "it is the worker at 127.0.0.1:" + port +
                                 " (the same process under another address); list it once");
}

// Two workers serving one model and a third another under the same name, the odd one listed
// first: the model most of them serve is used. Whoever came first won, and after a coordinator
// restart the workers register in any order: an odd worker that came back first locked out
// the two right ones (2 of 3 restarts in a black-box run) and took their sessions.
TEST(ModelNameConflictTest, TheModelMostWorkersServeUnderANameIsUsedWhoeverCameFirst) {
  RECALL_REQUIRE_SHARED_FILE(kModel);
  const std::string smol = testing::SharedPath("tokenizers/smollm2");
  if (!std::filesystem::exists(smol + "/config.json")) GTEST_SKIP() << "shared data missing";
  const std::string dir = testing::MakeTempDir("name_majority");
  ServerProcess odd, stories[2], coordinator;
  std::string error;
  ASSERT_TRUE(StartNamedWorker(odd, /*stories=*/false, "same", dir, &error)) << error;
  std::string workers = "127.0.0.1:" + std::to_string(odd.port("grpc"));
  for (ServerProcess& w : stories) {
    ASSERT_TRUE(StartNamedWorker(w, /*stories=*/true, "same", dir, &error)) << error;
    workers += ",127.0.0.1:" + std::to_string(w.port("grpc"));
  }
  ASSERT_TRUE(coordinator.Start(RECALL_COORDINATOR_BINARY,
                                {"--workers", workers, "--listen", "127.0.0.1:0", "--http-listen",
                                 "127.0.0.1:0", "--data-dir", dir},
                                dir, &error))
      << error;
  httplib::Client http("127.0.0.1", coordinator.port("http"));
  http.set_read_timeout(60, 0);
  Json models;
  for (int i = 0; i < 100; ++i) {  // all polled: their Info read
    models = Send(http, "GET", "/v1/models", "", "").JsonBody();
    if (models["data"].size() == 1 && models["data"][0]["workers"] == 2) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_EQ(models["data"].size(), 1u) << models.dump();
  EXPECT_EQ(models["data"][0]["context_length"], 512) << "stories260K, served by two";
  EXPECT_EQ(models["data"][0]["workers"], 2) << models.dump();
  for (int i = 0; i < 4; ++i) {
    const HttpReply r = Send(http, "POST", "/v1/chat/completions",
                             ChatBody({Message("user", "Once upon a time")}, 2, false), "");
    ASSERT_EQ(r.status, 200) << r.body;
  }
  EXPECT_EQ(WorkerLoad(odd).resident_sessions() + WorkerLoad(odd).offloaded_sessions(), 0)
      << "nothing ran on the odd model";
}

// Before any worker answers (recall serve's worker loading its model), a session is not
// made (it was stored with no model and no cache settings, for good): retryable.
TEST(NoWorkerYetTest, ASessionIsNotMadeBeforeAWorkerIsKnown) {
  const std::string dir = testing::MakeTempDir("no_worker_yet");
  ServerProcess coordinator;
  std::string error;
  ASSERT_TRUE(coordinator.Start(
      RECALL_COORDINATOR_BINARY,
      {"--workers", "127.0.0.1:1", "--listen", "127.0.0.1:0", "--data-dir", dir}, dir, &error))
      << error;
  auto chat = v1::Chat::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string(coordinator.port("grpc")), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  v1::CreateSessionRequest req;
  v1::Session made;
  const grpc::Status st = chat->CreateSession(&ctx, req, &made);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE) << st.error_message();
  EXPECT_NE(st.error_message().find("retryable"), std::string::npos) << st.error_message();
  EXPECT_NE(st.error_message().find("the 1 listed (127.0.0.1:1) have not answered"),
            std::string::npos)
      << "names the worker that does not answer: " << st.error_message();
  grpc::ClientContext list_ctx;
  v1::ListSessionsResponse page;
  ASSERT_TRUE(chat->ListSessions(&list_ctx, v1::ListSessionsRequest(), &page).ok());
  EXPECT_EQ(page.sessions_size(), 0) << "none left behind";
}

}  // namespace
}  // namespace recall
