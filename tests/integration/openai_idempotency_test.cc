// The HTTP API's Idempotency-Key (coordinator/http_api.h, "Retries") on a real coordinator and
// worker over loopback: a request sent again with its key gets the turn as stored (a body or
// a stream, "Idempotent-Replayed: true") instead of a second run, also after the coordinator
// restarted (a named session's key in its transcript, an unnamed one's and a completion's in
// the store's key records); a key naming another message or a malformed key is refused
// naming the header; a key whose
// turn is still running gets 409, and once that turn was interrupted (the client left) the
// key resumes it: the whole reply, the same as the turn without the interruption.
#include <atomic>
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/common/redis_server.h"
#include "tests/integration/openai_http_util.h"

namespace recall {
namespace {

// A completion body at temperature 1 (`seed` < 0: none).
std::string CompletionBody(int max_tokens, bool stream, int seed,
                           const std::string& prompt = "Once upon a time") {
  Json body = {
      {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 1}, {"stream", stream}};
  if (seed >= 0) body["seed"] = seed;
  return body.dump();
}

TEST_F(OpenAiHttpTest, AKeySentAgainGetsTheStoredTurnNotASecondRun) {
  const std::vector<Json> first = {Message("user", "Once upon a time")};
  const HttpReply one = Post("/v1/chat/completions", ChatBody(first, 8, false), "key-a",
                             {{"Idempotency-Key", "turn-1"}});
  ASSERT_EQ(one.status, 200) << one.body;
  EXPECT_EQ(one.Header("Idempotent-Replayed"), "");
  const std::string id = one.Header("X-Session-Id");
  const std::string text = ReplyText(one);
  ASSERT_FALSE(text.empty());

  const HttpReply again = Post("/v1/chat/completions", ChatBody(first, 8, false), "key-a",
                               {{"Idempotency-Key", "turn-1"}});
  ASSERT_EQ(again.status, 200) << again.body;
  EXPECT_EQ(again.Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(again.Header("X-Session-Id"), id);
  EXPECT_EQ(ReplyText(again), text);
  EXPECT_EQ(again.JsonBody()["usage"]["completion_tokens"],
            one.JsonBody()["usage"]["completion_tokens"]);
  const HttpReply streamed = Post("/v1/chat/completions", ChatBody(first, 8, true), "key-a",
                                  {{"Idempotency-Key", "turn-1"}});
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  EXPECT_EQ(streamed.Header("Content-Type"), "text/event-stream");
  EXPECT_EQ(StreamedText(streamed.body), text);
  EXPECT_EQ(Events(streamed.body).back(), "[DONE]");
  // Another tenant's request with the same key is its own turn.
  const HttpReply theirs = Post("/v1/chat/completions", ChatBody(first, 8, false), "key-b",
                                {{"Idempotency-Key", "turn-1"}});
  ASSERT_EQ(theirs.status, 200) << theirs.body;
  EXPECT_EQ(theirs.Header("Idempotent-Replayed"), "");
  EXPECT_NE(theirs.Header("X-Session-Id"), id);

  v1::Session s = GetSession(id);
  ASSERT_EQ(s.messages_size(), 2) << "one turn, run once";
  EXPECT_EQ(s.messages(0).turn_id(), "turn-1");

  // The next turn, with its own key, continues the session; the first key still replays.
  std::vector<Json> second = first;
  second.push_back(Message("assistant", text));
  second.push_back(Message("user", "Then what?"));
  const HttpReply two = Post("/v1/chat/completions", ChatBody(second, 6, false), "key-a",
                             {{"Idempotency-Key", "turn-2"}});
  ASSERT_EQ(two.status, 200) << two.body;
  EXPECT_EQ(two.Header("X-Session-Id"), id);
  s = GetSession(id);
  ASSERT_EQ(s.messages_size(), 4);
  EXPECT_EQ(s.messages(2).turn_id(), "turn-2");
  EXPECT_EQ(ReplyText(Post("/v1/chat/completions", ChatBody(first, 8, false), "key-a",
                           {{"Idempotency-Key", "turn-1"}})),
            text);
  EXPECT_EQ(GetSession(id).messages_size(), 4);

  // The key sent with a completion names another request: 400 naming the header as its param.
  const HttpReply completion = Post("/v1/completions", CompletionBody(4, false, 5), "key-a",
                                    {{"Idempotency-Key", "turn-1"}});
  EXPECT_EQ(completion.status, 400) << completion.body;
  EXPECT_EQ(completion.JsonBody()["error"]["param"], "Idempotency-Key") << completion.body;

  // Deleted, the session takes its keys' records along (those of tenant b's session stay);
  // the key then runs its turn anew, in a new session, for this coordinator remembered it.
  EXPECT_EQ(StoredRecords("k:"), 3);
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer key-a");
    v1::DeleteSessionRequest del;
    del.set_session_id(id);
    v1::DeleteSessionResponse ignored;
    ASSERT_TRUE(chat_->DeleteSession(&ctx, del, &ignored).ok());
  }
  EXPECT_EQ(StoredRecords("k:"), 1);
  const HttpReply anew = Post("/v1/chat/completions", ChatBody(first, 8, false), "key-a",
                              {{"Idempotency-Key", "turn-1"}});
  ASSERT_EQ(anew.status, 200) << anew.body;
  EXPECT_EQ(anew.Header("Idempotent-Replayed"), "");
  EXPECT_NE(anew.Header("X-Session-Id"), id);
  EXPECT_EQ(ReplyText(anew), text) << "greedy: the same reply";
  EXPECT_EQ(StoredRecords("k:"), 2);
}

TEST_F(OpenAiHttpTest, ANamedSessionsKeyIsFoundInTheStoreAfterARestart) {
  const std::vector<Json> first = {Message("user", "Once upon a time")};
  const HttpReply one = Post("/v1/chat/completions", ChatBody(first, 8, false), "key-a",
                             {{"Idempotency-Key", "named-1"}});
  ASSERT_EQ(one.status, 200) << one.body;
  const std::string id = one.Header("X-Session-Id");
  coordinator_.Stop();
  StartCoordinator();
  const HttpReply again = Post("/v1/chat/completions", ChatBody(first, 8, false), "key-a",
                               {{"Idempotency-Key", "named-1"}, {"X-Session-Id", id}});
  ASSERT_EQ(again.status, 200) << again.body;
  EXPECT_EQ(again.Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(ReplyText(again), ReplyText(one));
  EXPECT_EQ(GetSession(id).messages_size(), 2);
}

// A store damaged on disk (the table of streamed reply parts zeroed while the coordinator was
// down): with --allow-store-loss what it can read is copied into a new file (sqlite_salvage.h),
// and turns are served and stored. Served in place, a turn that could not store its reply
// failed, not retryable (DATA_LOSS: response_test.cc); that is left for damage the start's
// check does not see.
TEST_F(OpenAiHttpTest, ATurnOnAStoreSalvagedAtStartIsServedAndStored) {
  const std::vector<Json> first = {Message("user", "Once upon a time")};
  ASSERT_EQ(Post("/v1/chat/completions", ChatBody(first, 8, false)).status, 200);
  coordinator_.Stop();
  const testing::Exit damaged = testing::RunToExit(
      "python3 -c \"import sqlite3; p='" + dir_ +
      "/sessions.db'; c=sqlite3.connect(p); "
      "root=c.execute(\\\"select rootpage from sqlite_master where name='reply_parts'\\\")"
      ".fetchone()[0]; size=c.execute('pragma page_size').fetchone()[0]; c.close(); "
      "f=open(p,'r+b'); f.seek((root-1)*size); f.write(bytes(size)); f.close(); print(root)\"");
  ASSERT_EQ(damaged.code, 0) << damaged.output;
  StartCoordinator({"--allow-store-loss"});  // refused otherwise
  EXPECT_EQ(SessionCount(), 1) << "its session kept";
  const HttpReply r = Post("/v1/chat/completions", ChatBody(first, 8, false));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(GetSession(r.Header("X-Session-Id")).messages_size(), 2) << "stored";
  int kept = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir_)) {
    kept += entry.path().filename().string().rfind("sessions.db.damaged-", 0) == 0;
  }
  EXPECT_GE(kept, 1) << "the damaged file is kept beside the new one (and its log)";
}

// A client that cut the conversation's first reply short (it stopped reading; the server had
// written it whole) sends the part it read and a new message, naming no session: its session
// goes on, found by the conversation's opening, as there is no earlier exchange to find it by
// (it went to a new, cold session). Another reply in the part's place is another conversation.
TEST_F(OpenAiHttpTest, APartOfTheFirstReplyAndANewMessageContinueItsSession) {
  const std::vector<Json> opening = {Message("system", "Tell a story."),
                                     Message("user", "Once upon a time")};
  const HttpReply first = Post("/v1/chat/completions", ChatBody(opening, 24, false));
  ASSERT_EQ(first.status, 200) << first.body;
  const std::string id = first.Header("X-Session-Id");
  const std::string reply = ReplyText(first);
  ASSERT_GT(reply.size(), 4u) << reply;
  std::vector<Json> list = opening;
  list.push_back(Message("assistant", reply.substr(0, reply.size() / 2)));
  list.push_back(Message("user", "And then?"));
  const HttpReply on = Post("/v1/chat/completions", ChatBody(list, 2, false));
  ASSERT_EQ(on.status, 200) << on.body;
  EXPECT_EQ(on.Header("X-Session-Id"), id) << "the same session";
  list[2] = Message("assistant", "Something else entirely");
  const HttpReply other = Post("/v1/chat/completions", ChatBody(list, 2, false));
  ASSERT_EQ(other.status, 200) << other.body;
  EXPECT_NE(other.Header("X-Session-Id"), id);
}

TEST_F(OpenAiHttpTest, BadKeysAreRefusedNamingTheHeader) {
  const std::vector<Json> hi = {Message("user", "Once upon a time")};
  ASSERT_EQ(
      Post("/v1/chat/completions", ChatBody(hi, 4, false), "key-a", {{"Idempotency-Key", "k-1"}})
          .status,
      200);
  const struct {
    std::string body;
    std::string key;
    std::string expect;
  } cases[] = {
      {ChatBody({Message("user", "Another beginning")}, 4, false), "k-1",
       "Idempotency-Key: \"k-1\" names message 0 of session"},
      {ChatBody(hi, 4, false), "has space", "Idempotency-Key: may hold only A-Z a-z 0-9 . _ : -"},
      {ChatBody(hi, 4, false), std::string(129, 'k'), "Idempotency-Key: 129 bytes; at most 128"},
  };
  for (const auto& c : cases) {
    const HttpReply r = Post("/v1/chat/completions", c.body, "key-a", {{"Idempotency-Key", c.key}});
    EXPECT_EQ(r.status, 400) << c.expect << ": " << r.body;
    const std::string message = r.JsonBody()["error"]["message"].get<std::string>();
    EXPECT_NE(message.find(c.expect), std::string::npos) << message;
  }
  // Two keys in one request: which one it names is not guessed.
  for (const std::string path : {"/v1/chat/completions", "/v1/completions"}) {
    const std::string body =
        path == "/v1/completions" ? R"({"prompt":"Once","max_tokens":2})" : ChatBody(hi, 4, false);
    const HttpReply r =
        Post(path, body, "key-a", {{"Idempotency-Key", "k-2"}, {"Idempotency-Key", "k-3"}});
    EXPECT_EQ(r.status, 400) << path << ": " << r.body;
    EXPECT_EQ(r.JsonBody()["error"]["message"], "Idempotency-Key: sent 2 times; send one key")
        << r.body;
  }
}

// The slow model: a key whose turn is running is 409 (the SDKs' retryable conflict); the
// client leaves mid-stream, the turn is stored interrupted, and the key resumes it in the same
// session: the reply (a body, then a stream) is the one the turn gives without the
// interruption, and the transcript holds that one turn, complete.
TEST_F(OpenAiHttpCancelTest, AKeysRunningTurnIs409AndItsInterruptedTurnIsResumed) {
  httplib::Client client("127.0.0.1", coordinator_.port("http"));
  client.set_read_timeout(120, 0);
  httplib::Client other("127.0.0.1", coordinator_.port("http"));
  other.set_read_timeout(120, 0);
  const std::vector<Json> asked = {Message("user", "Once upon a time")};
  const HttpReply reference =
      Send(client, "POST", "/v1/chat/completions", ChatBody(asked, 40, false), "");
  ASSERT_EQ(reference.status, 200) << reference.body;
  HttpReply while_running;
  const HttpReply r =
      Send(client, "POST", "/v1/chat/completions", ChatBody(asked, 40, true), "",
           {{"Idempotency-Key", "slow-1"}}, [&](const std::string& so_far) {
             const size_t text = so_far.find("\"content\":\"", 60);
             if (text == std::string::npos || so_far.find("\n\n", text) == std::string::npos) {
               return true;
             }
             while_running = Send(other, "POST", "/v1/chat/completions", ChatBody(asked, 40, false),
                                  "", {{"Idempotency-Key", "slow-1"}});
             return false;  // hang up
           });
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(while_running.status, 409) << while_running.body;
  EXPECT_NE(while_running.body.find("a request with this key is running"), std::string::npos)
      << while_running.body;
  const std::string id = r.Header("X-Session-Id");

  auto chat = v1::Chat::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(coordinator_.port("grpc")),
                          grpc::InsecureChannelCredentials()));
  const auto session = [&] {
    grpc::ClientContext ctx;
    v1::GetSessionRequest req;
    req.set_session_id(id);
    v1::Session s;
    EXPECT_TRUE(chat->GetSession(&ctx, req, &s).ok());
    return s;
  };
  v1::Session s;
  for (int i = 0; i < 1000; ++i) {  // the hang-up reaches the coordinator at its next write
    s = session();
    if (s.messages_size() == 2 && s.messages(1).state() == v1::TURN_STATE_INTERRUPTED) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(s.messages_size(), 2);
  ASSERT_EQ(s.messages(1).state(), v1::TURN_STATE_INTERRUPTED);
  const std::string part = s.messages(1).content();
  const std::string whole = ReplyText(reference);
  ASSERT_LT(part.size(), whole.size()) << "interrupted before its end";

  // Sent again (as an SDK would after the broken stream): resumed, in the same session.
  HttpReply again;
  for (int i = 0; i < 100; ++i) {  // until the first request released its key
    again = Send(client, "POST", "/v1/chat/completions", ChatBody(asked, 40, false), "",
                 {{"Idempotency-Key", "slow-1"}});
    if (again.status != 409) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(again.status, 200) << again.body;
  EXPECT_EQ(again.Header("Idempotent-Replayed"), "");
  EXPECT_EQ(again.Header("X-Session-Id"), id);
  EXPECT_EQ(ReplyText(again).rfind(part, 0), 0u) << "the stored part first";
  EXPECT_EQ(ReplyText(again), whole) << "the reply of the turn without the interruption";
  s = session();
  ASSERT_EQ(s.messages_size(), 2) << "one turn";
  EXPECT_EQ(s.messages(0).turn_id(), "slow-1");
  EXPECT_EQ(s.messages(1).state(), v1::TURN_STATE_COMPLETE);
  EXPECT_EQ(s.messages(1).content(), whole);
  // And now it replays.
  const HttpReply replayed = Send(client, "POST", "/v1/chat/completions",
                                  ChatBody(asked, 40, false), "", {{"Idempotency-Key", "slow-1"}});
  EXPECT_EQ(replayed.Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(ReplyText(replayed), whole);
}

// Sessions that evict (lazy, 64 tokens per layer and KV head, every 16 steps).
class OpenAiHttpLazyCancelTest : public OpenAiHttpCancelTest {
 protected:
  std::vector<std::string> ExtraWorkerFlags() const override {
    return {"--policy", "lazy", "--budget", "64", "--window", "16"};
  }
};

// A turn of a session that evicts, interrupted by its client leaving and sent again with its
// key. The worker took the aborted attempt back but kept what its steps evicted, and the
// resume went on from that cache: its reply differed from the one without the interruption
// (a black-box run: 5 of 5). The resume leaves the attempt out and has the worker rebuild.
TEST_F(OpenAiHttpLazyCancelTest, AnInterruptedTurnIsResumedAsTheReplyWithoutTheInterruption) {
  httplib::Client client("127.0.0.1", coordinator_.port("http"));
  client.set_read_timeout(120, 0);
  const Json u1 = Message("user", "Once upon a time");
  const Json u2 = Message("user", "Tell me more about it");
  // Without a fault (its own session): the first reply fills the budget, the second evicts.
  const HttpReply first =
      Send(client, "POST", "/v1/chat/completions", ChatBody({u1}, 80, false), "");
  ASSERT_EQ(first.status, 200) << first.body;
  const std::string r1 = ReplyText(first);
  const std::vector<Json> asked = {u1, Message("assistant", r1), u2};
  const HttpReply reference =
      Send(client, "POST", "/v1/chat/completions", ChatBody(asked, 60, false), "",
           {{"X-Session-Id", first.Header("X-Session-Id")}});
  ASSERT_EQ(reference.status, 200) << reference.body;
  ASSERT_GT(Json::parse(reference.body)["usage"]["prompt_tokens_details"]["cached_tokens"], 0);

  // The same conversation in another session, its second turn interrupted past an eviction.
  const HttpReply again_first =
      Send(client, "POST", "/v1/chat/completions", ChatBody({u1}, 80, false), "");
  ASSERT_EQ(again_first.status, 200) << again_first.body;
  const std::string id = again_first.Header("X-Session-Id");
  ASSERT_NE(id, first.Header("X-Session-Id"));
  ASSERT_EQ(ReplyText(again_first), r1);
  const HttpReply cut =
      Send(client, "POST", "/v1/chat/completions", ChatBody(asked, 60, true), "",
           {{"X-Session-Id", id}, {"Idempotency-Key", "lazy-1"}}, [](const std::string& so_far) {
             size_t chunks = 0;  // the role chunk, then 24 of text: past a window of 16 steps
             for (size_t at = so_far.find("data: "); at != std::string::npos;
                  at = so_far.find("data: ", at + 1)) {
               ++chunks;
             }
             return chunks < 25;
           });
  ASSERT_EQ(cut.status, 200);
  HttpReply resumed;
  for (int i = 0; i < 500; ++i) {  // 409 until the coordinator saw the hang-up
    resumed = Send(client, "POST", "/v1/chat/completions", ChatBody(asked, 60, false), "",
                   {{"X-Session-Id", id}, {"Idempotency-Key", "lazy-1"}});
    if (resumed.status != 409) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(resumed.status, 200) << resumed.body;
  EXPECT_EQ(resumed.Header("Idempotent-Replayed"), "") << "resumed, not replayed";
  EXPECT_EQ(ReplyText(resumed), ReplyText(reference))
      << "the reply of the turn without the interruption";
  // And the session goes on as the one without the fault.
  std::vector<Json> next = asked;
  next.push_back(Message("assistant", ReplyText(reference)));
  next.push_back(Message("user", "And then?"));
  const HttpReply ref_next = Send(client, "POST", "/v1/chat/completions", ChatBody(next, 30, false),
                                  "", {{"X-Session-Id", first.Header("X-Session-Id")}});
  const HttpReply got_next = Send(client, "POST", "/v1/chat/completions", ChatBody(next, 30, false),
                                  "", {{"X-Session-Id", id}});
  ASSERT_EQ(got_next.status, 200) << got_next.body;
  EXPECT_EQ(ReplyText(got_next), ReplyText(ref_next));
}

// A stream resumed: its events carry the stored part first, then the rest, as one reply.
TEST_F(OpenAiHttpCancelTest, AnInterruptedStreamIsResumedAsAStream) {
  httplib::Client client("127.0.0.1", coordinator_.port("http"));
  client.set_read_timeout(120, 0);
  const std::vector<Json> asked = {Message("user", "Once upon a time")};
  const HttpReply reference =
      Send(client, "POST", "/v1/chat/completions", ChatBody(asked, 30, false), "");
  ASSERT_EQ(reference.status, 200) << reference.body;
  const HttpReply r =
      Send(client, "POST", "/v1/chat/completions", ChatBody(asked, 30, true), "",
           {{"Idempotency-Key", "slow-2"}}, [&](const std::string& so_far) {
             const size_t text = so_far.find("\"content\":\"", 60);
             return text == std::string::npos || so_far.find("\n\n", text) == std::string::npos;
           });
  ASSERT_EQ(r.status, 200);
  HttpReply again;
  for (int i = 0; i < 500; ++i) {  // until the first request ended (409 until then)
    again = Send(client, "POST", "/v1/chat/completions", ChatBody(asked, 30, true), "",
                 {{"Idempotency-Key", "slow-2"}});
    if (again.status != 409) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(again.status, 200) << again.body;
  EXPECT_EQ(again.Header("X-Session-Id"), r.Header("X-Session-Id"));
  EXPECT_EQ(StreamedText(again.body), ReplyText(reference));
  EXPECT_EQ(Events(again.body).back(), "[DONE]");
}

// The text of a completion: its body's, or its stream's deltas.
std::string CompletionText(const HttpReply& r) {
  const Json j = r.JsonBody();
  if (!j.is_discarded() && j.contains("choices")) return j["choices"][0]["text"].get<std::string>();
  std::string text;
  for (const std::string& e : Events(r.body)) {
    const Json d = Json::parse(e, nullptr, false);
    if (d.is_discarded() || !d.contains("choices") || d["choices"].empty()) continue;
    if (d["choices"][0].contains("text")) text += d["choices"][0]["text"].get<std::string>();
  }
  return text;
}

// /v1/completions keeps no session, so a keyed completion is remembered by the coordinator:
// 409 while it runs; once the client left mid-stream the key resumes it with the same draws
// (sampled, at temperature 1), so the completion is the one without the interruption; then it
// replays; the key with another prompt is refused naming the header. Without a seed in the
// request the coordinator's own seed is kept with it, so the resumed completion continues the
// part that was streamed and replays the same.
TEST_F(OpenAiHttpCancelTest, AKeyedCompletionIsResumedWithTheSameDrawsThenReplayed) {
  httplib::Client client("127.0.0.1", coordinator_.port("http"));
  client.set_read_timeout(120, 0);
  httplib::Client other("127.0.0.1", coordinator_.port("http"));
  other.set_read_timeout(120, 0);
  const HttpReply reference =
      Send(client, "POST", "/v1/completions", CompletionBody(40, false, 3), "");
  ASSERT_EQ(reference.status, 200) << reference.body;
  const std::string whole = CompletionText(reference);
  ASSERT_FALSE(whole.empty());
  const auto interrupted = [&](const std::string& key, int seed, HttpReply* while_running) {
    return Send(client, "POST", "/v1/completions", CompletionBody(40, true, seed), "",
                {{"Idempotency-Key", key}}, [&, key, seed](const std::string& so_far) {
                  const size_t text = so_far.find("\"text\":\"");
                  if (text == std::string::npos || so_far.find("\n\n", text) == std::string::npos) {
                    return true;
                  }
                  if (while_running != nullptr) {
                    *while_running =
                        Send(other, "POST", "/v1/completions", CompletionBody(40, false, seed), "",
                             {{"Idempotency-Key", key}});
                  }
                  return false;  // hang up
                });
  };
  const auto again = [&](const std::string& key, int seed, const std::string& prompt) {
    HttpReply r;
    for (int i = 0; i < 500; ++i) {  // until the first request released its key
      r = Send(client, "POST", "/v1/completions", CompletionBody(40, false, seed, prompt), "",
               {{"Idempotency-Key", key}});
      if (r.status != 409) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return r;
  };

  HttpReply while_running;
  const HttpReply cut = interrupted("c-1", 3, &while_running);
  ASSERT_EQ(cut.status, 200);
  EXPECT_EQ(while_running.status, 409) << while_running.body;
  const HttpReply resumed = again("c-1", 3, "Once upon a time");
  ASSERT_EQ(resumed.status, 200) << resumed.body;
  EXPECT_EQ(resumed.Header("Idempotent-Replayed"), "");
  EXPECT_EQ(CompletionText(resumed).rfind(CompletionText(cut), 0), 0u) << "the part sent first";
  EXPECT_EQ(CompletionText(resumed), whole) << "the completion without the interruption";
  const HttpReply replayed = again("c-1", 3, "Once upon a time");
  EXPECT_EQ(replayed.Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(CompletionText(replayed), whole);
  const HttpReply other_prompt = again("c-1", 3, "Lily went");
  EXPECT_EQ(other_prompt.status, 400) << other_prompt.body;
  EXPECT_NE(other_prompt.body.find("Idempotency-Key"), std::string::npos) << other_prompt.body;

  // No seed in the request: the coordinator's is kept with the key.
  const HttpReply cut2 = interrupted("c-2", -1, nullptr);
  ASSERT_EQ(cut2.status, 200);
  const HttpReply resumed2 = again("c-2", -1, "Once upon a time");
  ASSERT_EQ(resumed2.status, 200) << resumed2.body;
  EXPECT_EQ(CompletionText(resumed2).rfind(CompletionText(cut2), 0), 0u) << "the part sent first";
  EXPECT_GT(CompletionText(resumed2).size(), CompletionText(cut2).size());
  const HttpReply replayed2 = again("c-2", -1, "Once upon a time");
  EXPECT_EQ(replayed2.Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(CompletionText(replayed2), CompletionText(resumed2));
}

// A request that names no session finds its key's turn in the session store after the
// coordinator restarted (as another coordinator sharing the store would): the turn replayed,
// not run a second time. So does a keyed completion, and the key with another prompt is
// still refused.
TEST_F(OpenAiHttpTest, UnnamedAndCompletionKeysAreFoundInTheStoreAfterARestart) {
  const std::vector<Json> first = {Message("user", "Once upon a time")};
  const HttpReply one = Post("/v1/chat/completions", ChatBody(first, 8, false), "key-a",
                             {{"Idempotency-Key", "unnamed-1"}});
  ASSERT_EQ(one.status, 200) << one.body;
  const std::string id = one.Header("X-Session-Id");
  const HttpReply done = Post("/v1/completions", CompletionBody(12, false, 5), "key-a",
                              {{"Idempotency-Key", "completion-1"}});
  ASSERT_EQ(done.status, 200) << done.body;

  coordinator_.Stop();
  StartCoordinator();
  const HttpReply again = Post("/v1/chat/completions", ChatBody(first, 8, false), "key-a",
                               {{"Idempotency-Key", "unnamed-1"}});
  ASSERT_EQ(again.status, 200) << again.body;
  EXPECT_EQ(again.Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(again.Header("X-Session-Id"), id);
  EXPECT_EQ(ReplyText(again), ReplyText(one));
  EXPECT_EQ(GetSession(id).messages_size(), 2) << "one turn, run once";
  // Another tenant's key of the same name is not theirs.
  const HttpReply theirs = Post("/v1/chat/completions", ChatBody(first, 8, false), "key-b",
                                {{"Idempotency-Key", "unnamed-1"}});
  ASSERT_EQ(theirs.status, 200) << theirs.body;
  EXPECT_EQ(theirs.Header("Idempotent-Replayed"), "");

  const HttpReply replayed = Post("/v1/completions", CompletionBody(12, false, 5), "key-a",
                                  {{"Idempotency-Key", "completion-1"}});
  ASSERT_EQ(replayed.status, 200) << replayed.body;
  EXPECT_EQ(replayed.Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(CompletionText(replayed), CompletionText(done));
  const HttpReply other_prompt = Post("/v1/completions", CompletionBody(12, false, 5, "Lily went"),
                                      "key-a", {{"Idempotency-Key", "completion-1"}});
  EXPECT_EQ(other_prompt.status, 400) << other_prompt.body;
  EXPECT_NE(other_prompt.body.find("another prompt"), std::string::npos) << other_prompt.body;
}

// A real redis-server, one recall-worker (started with `worker_args`) and two coordinators
// sharing the Redis store, each with its HTTP API (clients ha_ and hb_).
class OpenAiRedisTest : public ::testing::Test {
 protected:
  void StartCluster(const std::string& name, const std::vector<std::string>& worker_args,
                    const std::vector<std::string>& coordinator_args = {}) {
    dir_ = testing::MakeTempDir(name);
    ASSERT_TRUE(redis_.Start(dir_));
    std::string error;
    std::vector<std::string> args = worker_args;
    args.insert(args.end(), {"--listen", "127.0.0.1:0", "--threads", "1"});
    ASSERT_TRUE(worker_.Start(RECALL_WORKER_BINARY, args, dir_, &error)) << error;
    const std::string w = "127.0.0.1:" + std::to_string(worker_.port("grpc"));
    for (ServerProcess* c : {&a_, &b_}) {
      std::vector<std::string> c_args = {
          "--workers",   w,         "--listen",  "127.0.0.1:0", "--http-listen",
          "127.0.0.1:0", "--store", redis_.url()};
      c_args.insert(c_args.end(), coordinator_args.begin(), coordinator_args.end());
      ASSERT_TRUE(c->Start(RECALL_COORDINATOR_BINARY, c_args, dir_, &error)) << error;
    }
    ha_ = std::make_unique<httplib::Client>("127.0.0.1", a_.port("http"));
    hb_ = std::make_unique<httplib::Client>("127.0.0.1", b_.port("http"));
    ha_->set_read_timeout(120, 0);
    hb_->set_read_timeout(120, 0);
  }

  // The cluster on a slow model: random weights of SmolLM2's shape, tens of ms a token.
  // Skips without the shared config or redis-server (callers return on IsSkipped()).
  void StartSlowCluster(const std::string& name, const std::string& kv_cache_bytes,
                        const std::vector<std::string>& coordinator_args = {}) {
    const std::string config = testing::SharedPath("tokenizers/smollm2/config.json");
    if (!std::filesystem::exists(config)) GTEST_SKIP() << "shared data missing: " << config;
    if (!testing::RedisServer::Available()) GTEST_SKIP() << "redis-server is not installed";
    StartCluster(name,
                 {"--model", testing::SharedPath("tokenizers/smollm2"), "--random-weights",
                  "--kv-cache-bytes", kv_cache_bytes},
                 coordinator_args);
  }

  // A keyed request whose worker stays silent past the 2 s lease (a long prefill, no token
  // yet) sent to coordinator a, and the same request sent to b meanwhile, after 3.5 s.
  struct SilentRace {
    HttpReply first, meanwhile;
    bool still_running = false;  // first had not ended when meanwhile was sent
    double seconds = 0;          // in all
  };
  SilentRace RaceASilentRequest(const std::string& path, const std::string& body,
                                const std::string& key) {
    SilentRace r;
    const auto started = std::chrono::steady_clock::now();
    std::atomic<bool> first_done{false};
    std::thread runner([&] {
      r.first = Send(*ha_, "POST", path, body, "", {{"Idempotency-Key", key}});
      first_done = true;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(3500));  // 1.75 leases
    r.still_running = !first_done;
    r.meanwhile = Send(*hb_, "POST", path, body, "", {{"Idempotency-Key", key}});
    runner.join();
    r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    return r;
  }

  static std::string LongPrompt() {
    std::string prompt;
    for (int i = 0; i < 250; ++i) prompt += "The cat sat on the mat by the door. ";
    return prompt;
  }

  std::string dir_;
  testing::RedisServer redis_;
  ServerProcess worker_, a_, b_;
  std::unique_ptr<httplib::Client> ha_, hb_;
};

// Two coordinators sharing one Redis store (the Helm chart's replicas): a stateless client's
// conversation begun on one continues in the same session, on the same warm cache, through
// the other; a retried key reaching the other replica gets the turn, or the completion, once.
TEST_F(OpenAiRedisTest, TwoCoordinatorsShareStatelessSessionsAndKeysThroughRedis) {
  RECALL_REQUIRE_SHARED_FILE(kModel);
  if (!testing::RedisServer::Available()) GTEST_SKIP() << "redis-server is not installed";
  StartCluster("openai_redis", {"--model", testing::SharedPath(kModel), "--tokenizer",
                                testing::SharedPath(kTokenizer), "--kv-cache-bytes", "16M"});
  if (HasFatalFailure()) return;
  httplib::Client &ha = *ha_, &hb = *hb_;
  auto post = [](httplib::Client& c, const std::string& path, const std::string& body,
                 httplib::Headers headers = {}) {
    return Send(c, "POST", path, body, "", std::move(headers));
  };

  std::vector<Json> messages = {Message("user", "Once upon a time")};
  const HttpReply one = post(ha, "/v1/chat/completions", ChatBody(messages, 8, false),
                             {{"Idempotency-Key", "redis-1"}});
  ASSERT_EQ(one.status, 200) << one.body;
  const std::string id = one.Header("X-Session-Id");
  // The same request retried through the other replica: replayed, not run again.
  const HttpReply retried = post(hb, "/v1/chat/completions", ChatBody(messages, 8, false),
                                 {{"Idempotency-Key", "redis-1"}});
  ASSERT_EQ(retried.status, 200) << retried.body;
  EXPECT_EQ(retried.Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(retried.Header("X-Session-Id"), id);
  EXPECT_EQ(ReplyText(retried), ReplyText(one));
  // The next turn through the other replica continues the session and its cache.
  messages.push_back(Message("assistant", ReplyText(one)));
  messages.push_back(Message("user", "What happened next?"));
  const HttpReply two = post(hb, "/v1/chat/completions", ChatBody(messages, 8, false));
  ASSERT_EQ(two.status, 200) << two.body;
  EXPECT_EQ(two.Header("X-Session-Id"), id);
  EXPECT_GT(two.JsonBody()["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 0)
      << two.body;

  const HttpReply done =
      post(ha, "/v1/completions", CompletionBody(10, false, 9), {{"Idempotency-Key", "redis-c"}});
  ASSERT_EQ(done.status, 200) << done.body;
  const HttpReply again =
      post(hb, "/v1/completions", CompletionBody(10, false, 9), {{"Idempotency-Key", "redis-c"}});
  ASSERT_EQ(again.status, 200) << again.body;
  EXPECT_EQ(again.Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(CompletionText(again), CompletionText(done));
}

// A keyed completion running on one coordinator is seen by another sharing the Redis store:
// the key sent there meanwhile is 409 (its record is in progress under its coordinator's
// lease), and once the completion ended it is replayed there. A slow model (random weights of
// SmolLM2's shape) keeps the first one running.
TEST_F(OpenAiRedisTest, AKeyedCompletionRunningOnOneCoordinatorIs409OnTheOther) {
  StartSlowCluster("openai_redis_running", "64M");
  if (IsSkipped() || HasFatalFailure()) return;
  httplib::Client &ha = *ha_, &hb = *hb_;
  HttpReply meanwhile;
  const HttpReply first =
      Send(ha, "POST", "/v1/completions", CompletionBody(30, true, 4), "",
           {{"Idempotency-Key", "running-1"}}, [&](const std::string& so_far) {
             if (meanwhile.status == 0 && so_far.find("\"text\":\"") != std::string::npos) {
               meanwhile = Send(hb, "POST", "/v1/completions", CompletionBody(30, false, 4), "",
                                {{"Idempotency-Key", "running-1"}});
             }
             return true;  // read it to its end
           });
  ASSERT_EQ(first.status, 200) << first.body;
  EXPECT_EQ(meanwhile.status, 409) << meanwhile.body;
  EXPECT_NE(meanwhile.body.find("another coordinator"), std::string::npos) << meanwhile.body;
  const HttpReply after = Send(hb, "POST", "/v1/completions", CompletionBody(30, false, 4), "",
                               {{"Idempotency-Key", "running-1"}});
  ASSERT_EQ(after.status, 200) << after.body;
  EXPECT_EQ(after.Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(CompletionText(after), CompletionText(first));
}

// A keyed completion whose worker is silent for longer than the lease (a long prefill of
// random weights of SmolLM2's shape on one thread, no token yet) keeps its claim: its
// coordinator renews the lease while it waits, so the key sent to the other coordinator
// meanwhile is 409, not a second run of the completion.
TEST_F(OpenAiRedisTest, ASilentKeyedCompletionKeepsItsLease) {
  StartSlowCluster("openai_redis_silent", "256M", {"--completion-lease", "2"});
  if (IsSkipped() || HasFatalFailure()) return;
  const SilentRace r =
      RaceASilentRequest("/v1/completions", CompletionBody(2, false, 4, LongPrompt()), "silent-1");
  ASSERT_EQ(r.first.status, 200) << r.first.body;
  ASSERT_TRUE(r.still_running) << "the prefill ended in under 3.5 s (" << r.seconds
                               << " s in all): too fast to leave the worker silent";
  EXPECT_EQ(r.meanwhile.status, 409) << r.meanwhile.body;
  EXPECT_NE(r.meanwhile.body.find("another coordinator"), std::string::npos) << r.meanwhile.body;
}

// The same for a keyed session turn: its reply in progress stays claimed while its worker is
// silent for longer than the turn lease (the journal renews it with an empty write), so the
// key sent to the other coordinator meanwhile is 409 ("still running"), not a resume of a
// turn read as interrupted (a second run). Its session then takes the next turn.
TEST_F(OpenAiRedisTest, ASilentSessionTurnKeepsItsLease) {
  StartSlowCluster("openai_redis_silent_turn", "256M", {"--turn-lease", "2"});
  if (IsSkipped() || HasFatalFailure()) return;
  const std::string body = ChatBody({Message("user", LongPrompt())}, 2, false);
  const SilentRace r = RaceASilentRequest("/v1/chat/completions", body, "silent-turn");
  ASSERT_EQ(r.first.status, 200) << r.first.body;
  ASSERT_TRUE(r.still_running) << "the prefill ended in under 3.5 s (" << r.seconds
                               << " s in all): too fast to leave the worker silent";
  EXPECT_EQ(r.meanwhile.status, 409) << r.meanwhile.body;
  EXPECT_NE(r.meanwhile.body.find("still running"), std::string::npos) << r.meanwhile.body;
  // Complete now: the key replays the reply on either coordinator.
  const HttpReply replayed =
      Send(*hb_, "POST", "/v1/chat/completions", body, "", {{"Idempotency-Key", "silent-turn"}});
  ASSERT_EQ(replayed.status, 200) << replayed.body;
  EXPECT_EQ(replayed.Header("Idempotent-Replayed"), "true");
  EXPECT_EQ(ReplyText(replayed), ReplyText(r.first));
}

// A session whose turn is running on one coordinator is not cut by the other: a message
// list that diverges from its transcript (a regenerate of the running turn) is 409 there
// while the turn streams, refused before the store is touched (it was truncated, and the
// running turn's writes could land in the other's reply); the running turn ends complete,
// as its client saw it.
TEST_F(OpenAiRedisTest, ARunningTurnIsNotCutByTheOtherCoordinator) {
  StartSlowCluster("openai_redis_cut", "256M");
  if (IsSkipped() || HasFatalFailure()) return;
  const HttpReply one = Send(*ha_, "POST", "/v1/chat/completions",
                             ChatBody({Message("user", "Hello")}, 2, false), "");
  ASSERT_EQ(one.status, 200) << one.body;
  const std::string id = one.Header("X-Session-Id");
  const std::vector<Json> two = {Message("user", "Hello"), Message("assistant", ReplyText(one)),
                                 Message("user", "Tell me a long story")};
  std::atomic<bool> streaming{false};
  HttpReply running;
  std::thread runner([&] {
    running = Send(*ha_, "POST", "/v1/chat/completions", ChatBody(two, 60, true), "",
                   {{"X-Session-Id", id}}, [&](const std::string& so_far) {
                     if (so_far.find("\"content\":\"", 60) != std::string::npos) streaming = true;
                     return true;
                   });
  });
  for (int i = 0; i < 3000 && !streaming; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const std::vector<Json> other = {Message("user", "Hello"), Message("assistant", ReplyText(one)),
                                   Message("user", "Something else")};
  const HttpReply cut = Send(*hb_, "POST", "/v1/chat/completions", ChatBody(other, 2, false), "",
                             {{"X-Session-Id", id}});
  runner.join();
  ASSERT_TRUE(streaming) << running.body;
  ASSERT_EQ(running.status, 200) << running.body;
  EXPECT_EQ(cut.status, 409) << cut.body;
  // Refused by the coordinator before the store is touched (the worker would refuse it
  // too, busy, but only after the transcript was cut and then put back under the running turn).
  EXPECT_NE(cut.body.find("running on another coordinator"), std::string::npos) << cut.body;
  // The transcript: the running turn, complete, as streamed.
  const std::string streamed = StreamedText(running.body);
  auto chat = v1::Chat::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(b_.port("grpc")),
                                                    grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  v1::GetSessionRequest req;
  req.set_session_id(id);
  v1::Session session;
  ASSERT_TRUE(chat->GetSession(&ctx, req, &session).ok());
  ASSERT_EQ(session.messages_size(), 4);
  EXPECT_EQ(session.messages(2).content(), "Tell me a long story");
  EXPECT_EQ(session.messages(3).state(), v1::TURN_STATE_COMPLETE);
  EXPECT_EQ(session.messages(3).content(), streamed);
}

// The store fails while a keyed turn streams (Redis killed after its first text), and comes
// back; the key sent again to the same coordinator resumes the turn at once: this coordinator
// knows no turn of the session runs here, so the reply it left in progress is an orphan. It
// was 409 "still running" until the turn's lease passed (60 s), past the SDKs' retries.
TEST_F(OpenAiRedisTest, AKeyedTurnTheStoreLostMidReplyIsResumedOnItsCoordinatorAtOnce) {
  RECALL_REQUIRE_SHARED_FILE(kModel);
  if (!testing::RedisServer::Available()) GTEST_SKIP() << "redis-server is not installed";
  StartCluster("openai_redis_orphan", {"--model", testing::SharedPath(kModel), "--tokenizer",
                                       testing::SharedPath(kTokenizer), "--kv-cache-bytes", "16M"});
  if (HasFatalFailure()) return;
  const std::string body = ChatBody({Message("user", "Once upon a time")}, 200, true);
  const HttpReply reference = Send(*ha_, "POST", "/v1/chat/completions", body, "");
  ASSERT_EQ(reference.status, 200) << reference.body;
  bool killed = false;
  const HttpReply cut =
      Send(*ha_, "POST", "/v1/chat/completions", body, "", {{"Idempotency-Key", "orphan-1"}},
           [&](const std::string& so_far) {
             if (!killed && so_far.find("\"content\":\"", 60) != std::string::npos) {
               redis_.Kill();
               killed = true;
             }
             return true;
           });
  ASSERT_TRUE(killed) << cut.body;
  EXPECT_NE(cut.body.find("the session store failed while the reply was streaming"),
            std::string::npos)
      << cut.body;
  ASSERT_TRUE(redis_.Start(dir_, /*persistent=*/true, redis_.port()));
  HttpReply again;
  for (int i = 0; i < 100; ++i) {  // the store connection comes back on its next use
    again = Send(*ha_, "POST", "/v1/chat/completions", body, "", {{"Idempotency-Key", "orphan-1"}});
    if (again.status != 503) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(again.status, 200) << again.body;
  EXPECT_EQ(StreamedText(again.body), StreamedText(reference.body))
      << "the stored part, then the rest (greedy: the reply without the break)";
}

}  // namespace
}  // namespace recall
