// Helpers of the HTTP API's integration tests: one raw request over cpp-httplib's client (the
// bytes as they arrive, a hang-up when asked), SSE events, chat request bodies, and the two
// stacks they run against (stories260K; a slow random model for turns that are still running).
// The test target defines RECALL_WORKER_BINARY and RECALL_COORDINATOR_BINARY.
#pragma once

#include <httplib.h>
#include <sqlite3.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "common/subprocess.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "recall/v1/chat.grpc.pb.h"
#include "recall/v1/worker.grpc.pb.h"
#include "tests/common/test_util.h"

namespace recall {

using Json = nlohmann::json;

struct HttpReply {
  int status = 0;  // 0: no response
  std::string body;
  httplib::Headers headers;
  std::string Header(const std::string& name) const {
    auto it = headers.find(name);
    return it == headers.end() ? "" : it->second;
  }
  Json JsonBody() const { return Json::parse(body, nullptr, false); }
};

// One request; `headers` besides the key's Authorization ("" key: none). `receive`, when
// given, sees the body's bytes as they arrive and may return false to hang up.
inline HttpReply Send(httplib::Client& client, const std::string& method, const std::string& path,
                      const std::string& body, const std::string& key,
                      httplib::Headers headers = {},
                      std::function<bool(const std::string& so_far)> receive = nullptr) {
  httplib::Request req;
  req.method = method;
  req.path = path;
  req.headers = std::move(headers);
  if (!key.empty()) req.headers.emplace("Authorization", "Bearer " + key);
  if (!body.empty()) {
    req.body = body;
    if (req.headers.count("Content-Type") == 0) {
      req.headers.emplace("Content-Type", "application/json");
    }
  }
  HttpReply reply;
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    reply.body.append(data, n);
    return receive == nullptr || receive(reply.body);
  };
  httplib::Response res;
  httplib::Error error = httplib::Error::Success;
  if (client.send(req, res, error) || error == httplib::Error::Canceled) {
    reply.status = res.status;
    reply.headers = res.headers;
  }
  return reply;
}

// The events of an SSE body: each "data: " payload; EXPECTs the framing. Comments (the
// keep-alive, ": keep-alive") are left out.
inline std::vector<std::string> Events(const std::string& body) {
  std::vector<std::string> out;
  EXPECT_TRUE(body.size() >= 2 && body.substr(body.size() - 2) == "\n\n")
      << "a stream ends with a blank line";
  for (absl::string_view e : absl::StrSplit(body, "\n\n", absl::SkipEmpty())) {
    if (e.substr(0, 1) == ":") continue;
    EXPECT_EQ(e.substr(0, 6), "data: ") << "every event is one data line: " << e;
    EXPECT_EQ(e.find('\n'), absl::string_view::npos) << "one line per event: " << e;
    out.emplace_back(e.substr(6));
  }
  return out;
}

inline std::string ChatBody(const std::vector<Json>& messages, int max_tokens, bool stream,
                            const std::string& extra = "") {
  Json body = {{"messages", Json(messages)},
               {"max_tokens", max_tokens},
               {"temperature", 0},
               {"stream", stream}};
  if (stream) body["stream_options"] = {{"include_usage", true}};
  std::string text = body.dump();
  if (!extra.empty()) text = text.substr(0, text.size() - 1) + "," + extra + "}";
  return text;
}

// The text of a stream's deltas, concatenated.
inline std::string StreamedText(const std::string& body) {
  std::string text;
  for (const std::string& e : Events(body)) {
    if (e == "[DONE]") continue;
    const Json j = Json::parse(e, nullptr, false);
    if (j.is_discarded() || !j.contains("choices") || j["choices"].empty()) continue;
    const Json& delta = j["choices"][0]["delta"];
    if (delta.contains("content") && delta["content"].is_string()) {
      text += delta["content"].get<std::string>();
    }
  }
  return text;
}

inline std::string ReplyText(const HttpReply& r) {
  return r.JsonBody()["choices"][0]["message"]["content"].get<std::string>();
}

inline Json Message(const std::string& role, const std::string& content) {
  return {{"role", role}, {"content", content}};
}

inline constexpr char kModel[] = "models/stories260K/stories260K.bin";
inline constexpr char kTokenizer[] = "models/stories260K/tok512.bin";

// The load the worker `worker` reports (empty when it does not answer).
inline v1::LoadReport WorkerLoad(const ServerProcess& worker) {
  auto stub = v1::Worker::NewStub(grpc::CreateChannel(
      "127.0.0.1:" + std::to_string(worker.port("grpc")), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  v1::LoadReport load;
  if (!stub->GetLoad(&ctx, v1::GetLoadRequest(), &load).ok()) load.Clear();
  return load;
}

// A real recall-worker (stories260K) behind a real recall-coordinator with the HTTP API on,
// two API keys (key-a: tenant-a, key-b: tenant-b).
class OpenAiHttpTest : public ::testing::Test {
 protected:
  void SetUp() override {
    RECALL_REQUIRE_SHARED_FILE(kModel);
    dir_ = testing::MakeTempDir("openai_http");
    std::ofstream(dir_ + "/keys") << "key-a tenant-a\nkey-b tenant-b\n";
    std::string error;
    ASSERT_TRUE(worker_.Start(
        RECALL_WORKER_BINARY,
        {"--model", testing::SharedPath(kModel), "--tokenizer", testing::SharedPath(kTokenizer),
         "--listen", "127.0.0.1:0", "--kv-cache-bytes", "16M", "--threads", "1"},
        dir_, &error))
        << error;
    StartCoordinator();
  }

  // The coordinator (again: its sessions are in dir_'s store), with `extra` flags, and the
  // clients of it.
  void StartCoordinator(const std::vector<std::string>& extra = {}) {
    std::string error;
    std::vector<std::string> args = {"--workers",
                                     "127.0.0.1:" + std::to_string(worker_.port("grpc")),
                                     "--listen",
                                     "127.0.0.1:0",
                                     "--http-listen",
                                     "127.0.0.1:0",
                                     "--data-dir",
                                     dir_,
                                     "--api-keys",
                                     dir_ + "/keys",
                                     "--max-message-bytes",
                                     "4000"};
    args.insert(args.end(), extra.begin(), extra.end());
    ASSERT_TRUE(coordinator_.Start(RECALL_COORDINATOR_BINARY, args, dir_, &error)) << error;
    ASSERT_GT(coordinator_.port("http"), 0) << "the port file names the HTTP port";
    http_ = std::make_unique<httplib::Client>("127.0.0.1", coordinator_.port("http"));
    http_->set_read_timeout(120, 0);
    chat_ = v1::Chat::NewStub(
        grpc::CreateChannel("127.0.0.1:" + std::to_string(coordinator_.port("grpc")),
                            grpc::InsecureChannelCredentials()));
  }

  HttpReply Post(const std::string& path, const std::string& body, const std::string& key = "key-a",
                 httplib::Headers headers = {}) {
    return Send(*http_, "POST", path, body, key, std::move(headers));
  }

  // The session as the gRPC API sees it (the same store).
  v1::Session GetSession(const std::string& id, const std::string& key = "key-a") {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer " + key);
    v1::GetSessionRequest req;
    req.set_session_id(id);
    v1::Session s;
    const grpc::Status st = chat_->GetSession(&ctx, req, &s);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return s;
  }

  // How many sessions the tenant of `key` has (the gRPC API's list, one page).
  int SessionCount(const std::string& key = "key-a") {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer " + key);
    v1::ListSessionsRequest req;
    req.set_page_size(1000);
    v1::ListSessionsResponse page;
    const grpc::Status st = chat_->ListSessions(&ctx, req, &page);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return page.sessions_size();
  }

  // How many records named `prefix`... the coordinator's SQLite store holds (read beside it:
  // WAL readers do not block its writer).
  int StoredRecords(const std::string& prefix) {
    sqlite3* db = nullptr;
    int count = -1;
    if (sqlite3_open_v2((dir_ + "/sessions.db").c_str(), &db, SQLITE_OPEN_READONLY, nullptr) ==
        SQLITE_OK) {
      sqlite3_stmt* s = nullptr;
      if (sqlite3_prepare_v2(db, "SELECT count(*) FROM records WHERE substr(name, 1, ?1) = ?2", -1,
                             &s, nullptr) == SQLITE_OK) {
        sqlite3_bind_int(s, 1, static_cast<int>(prefix.size()));
        sqlite3_bind_text(s, 2, prefix.data(), static_cast<int>(prefix.size()), SQLITE_TRANSIENT);
        if (sqlite3_step(s) == SQLITE_ROW) count = sqlite3_column_int(s, 0);
      }
      sqlite3_finalize(s);
    }
    sqlite3_close(db);
    EXPECT_GE(count, 0) << "the store at " << dir_ << "/sessions.db could not be read";
    return count;
  }

  std::string dir_;
  ServerProcess worker_;
  ServerProcess coordinator_;
  std::unique_ptr<httplib::Client> http_;
  std::unique_ptr<v1::Chat::Stub> chat_;
};

// A slow model (random weights of SmolLM2's shape, tens of ms a token) so that a reply is
// still running when the client leaves.
class OpenAiHttpCancelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string config = testing::SharedPath("tokenizers/smollm2/config.json");
    if (!std::filesystem::exists(config)) GTEST_SKIP() << "shared data missing: " << config;
    dir_ = testing::MakeTempDir("openai_cancel");
    std::string error;
    std::vector<std::string> flags = {"--model",
                                      testing::SharedPath("tokenizers/smollm2"),
                                      "--random-weights",
                                      "--listen",
                                      "127.0.0.1:0",
                                      "--kv-cache-bytes",
                                      "256M",
                                      "--threads",
                                      "1"};
    for (const std::string& f : ExtraWorkerFlags()) flags.push_back(f);
    ASSERT_TRUE(worker_.Start(RECALL_WORKER_BINARY, flags, dir_, &error)) << error;
    std::vector<std::string> coordinator = {
        "--workers",      "127.0.0.1:" + std::to_string(worker_.port("grpc")),
        "--listen",       "127.0.0.1:0",
        "--http-listen",  "127.0.0.1:0",
        "--data-dir",     dir_,
        "--metrics-port", "0"};
    for (const std::string& f : ExtraCoordinatorFlags()) coordinator.push_back(f);
    ASSERT_TRUE(coordinator_.Start(RECALL_COORDINATOR_BINARY, coordinator, dir_, &error)) << error;
  }

  // More recall-worker flags (a fixture's session defaults), recall-coordinator flags.
  virtual std::vector<std::string> ExtraWorkerFlags() const { return {}; }
  virtual std::vector<std::string> ExtraCoordinatorFlags() const { return {}; }

  // POSTs a streaming chat `body` and hangs up once the role chunk and one chunk of text have
  // come whole (the client stopped the reply); the reply's body is empty when no text came.
  static HttpReply HangUpAfterFirstText(httplib::Client& client, const std::string& body,
                                        httplib::Headers headers = {}) {
    bool text = false;
    HttpReply r =
        Send(client, "POST", "/v1/chat/completions", body, "", std::move(headers),
             [&](const std::string& so_far) {
               const size_t at = so_far.find("\"content\":\"", 60);
               text = at != std::string::npos && so_far.find("\n\n", at) != std::string::npos;
               return !text;
             });
    if (!text) r.body.clear();
    return r;
  }

  // `list`, a conversation's first turn, sent (not streamed, 4 tokens, naming no session):
  // ASSERTs it was answered; its session's id and its reply in *id and *reply.
  static void FirstTurn(httplib::Client& client, const std::vector<Json>& list, std::string* id,
                        std::string* reply) {
    const HttpReply first =
        Send(client, "POST", "/v1/chat/completions", ChatBody(list, 4, false), "");
    ASSERT_EQ(first.status, 200) << first.body;
    *id = first.Header("X-Session-Id");
    *reply = Json::parse(first.body)["choices"][0]["message"]["content"];
  }

  // `list` sent (not streamed, 2 tokens, naming no session); EXPECTs that it continued
  // session `id` with its cache.
  static HttpReply SendAgainToContinue(httplib::Client& client, const std::vector<Json>& list,
                                       const std::string& id) {
    HttpReply again = Send(client, "POST", "/v1/chat/completions", ChatBody(list, 2, false), "");
    EXPECT_EQ(again.status, 200) << again.body;
    if (again.status != 200) return again;
    EXPECT_EQ(again.Header("X-Session-Id"), id) << "the same session";
    const Json usage = Json::parse(again.body)["usage"];
    EXPECT_GT(usage["prompt_tokens_details"]["cached_tokens"].get<int>(), 0) << usage.dump();
    return again;
  }

  // The coordinator's gRPC Chat service (no key: this fixture runs without API keys).
  std::unique_ptr<v1::Chat::Stub> ChatStub() {
    return v1::Chat::NewStub(
        grpc::CreateChannel("127.0.0.1:" + std::to_string(coordinator_.port("grpc")),
                            grpc::InsecureChannelCredentials()));
  }

  // Session `id` as GetSession gives it, once it holds `messages` messages and its last reply
  // is not in progress (the coordinator stores a stopped turn once its worker let it go);
  // as it is after 5 s otherwise.
  v1::Session WaitUntilStored(const std::string& id, int messages) {
    auto chat = ChatStub();
    v1::Session s;
    for (int i = 0; i < 500; ++i) {
      grpc::ClientContext ctx;
      v1::GetSessionRequest req;
      req.set_session_id(id);
      if (!chat->GetSession(&ctx, req, &s).ok()) s.Clear();
      if (s.messages_size() == messages &&
          s.messages(messages - 1).state() != v1::TURN_STATE_IN_PROGRESS) {
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return s;
  }

  v1::LoadReport Load() { return WorkerLoad(worker_); }

  std::string dir_;
  ServerProcess worker_;
  ServerProcess coordinator_;
};

}  // namespace recall
