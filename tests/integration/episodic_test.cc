// Policy "episodic" end to end: recall-coordinator and one recall-worker (stories260K) as
// real processes over loopback gRPC. A session created with episodic cache settings is
// answered as usual while its episodes are built in the background; once they are, every
// turn's ConverseDone reports them and GetSession shows the last report; bad episodic
// settings are refused with INVALID_ARGUMENT naming the field, the transcript unchanged.
#include <algorithm>
#include <cstdio>
#include <string>
#include <thread>

#include "common/subprocess.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "recall/v1/chat.grpc.pb.h"
#include "tests/common/test_util.h"

namespace recall {
namespace {

constexpr char kModel[] = "models/stories260K/stories260K.bin";
constexpr char kTokenizer[] = "models/stories260K/tok512.bin";

const char* const kStories[] = {
    "Lily had a red ball. She played with the ball in the park.",
    "Tom saw a big blue truck. The truck was very loud.",
    "Sue baked a cake with her dad. The cake was sweet.",
    "Ben found a bird in the garden. The bird had a hurt wing.",
};

class EpisodicServingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    RECALL_REQUIRE_SHARED_FILE(kModel);
    dir_ = testing::MakeTempDir("episodic");
    std::string error;
    ASSERT_TRUE(worker_.Start(RECALL_WORKER_BINARY,
                              {"--model", testing::SharedPath(kModel), "--tokenizer",
                               testing::SharedPath(kTokenizer), "--listen", "127.0.0.1:0",
                               "--kv-cache-bytes", "16M", "--threads", "1"},
                              dir_, &error))
        << error;
    ASSERT_TRUE(coordinator_.Start(
        RECALL_COORDINATOR_BINARY,
        {"--workers", "127.0.0.1:" + std::to_string(worker_.port("grpc")), "--listen",
         "127.0.0.1:0", "--data-dir", dir_},
        dir_, &error))
        << error;
    stub_ = v1::Chat::NewStub(grpc::CreateChannel(
        "127.0.0.1:" + std::to_string(coordinator_.port("grpc")),
        grpc::InsecureChannelCredentials()));
  }

  static void Deadline(grpc::ClientContext* ctx) {
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  }

  std::string Create(const v1::CacheSettings& cache) {
    grpc::ClientContext ctx;
    Deadline(&ctx);
    v1::CreateSessionRequest req;
    *req.mutable_cache() = cache;
    v1::Session s;
    const grpc::Status st = stub_->CreateSession(&ctx, req, &s);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return s.session_id();
  }

  grpc::Status Say(const std::string& session, const std::string& message, v1::ConverseDone* done,
                   int max_tokens = 8) {
    grpc::ClientContext ctx;
    Deadline(&ctx);
    v1::ConverseRequest req;
    req.set_session_id(session);
    req.set_message(message);
    req.mutable_sampling()->set_temperature(0);
    req.mutable_sampling()->set_max_tokens(max_tokens);
    auto reader = stub_->Converse(&ctx, req);
    v1::ConverseEvent ev;
    while (reader->Read(&ev)) {
      if (ev.has_done()) *done = ev.done();
    }
    return reader->Finish();
  }

  v1::Session Get(const std::string& session) {
    grpc::ClientContext ctx;
    Deadline(&ctx);
    v1::GetSessionRequest req;
    req.set_session_id(session);
    v1::Session s;
    EXPECT_TRUE(stub_->GetSession(&ctx, req, &s).ok());
    return s;
  }

  static v1::CacheSettings Episodic() {
    v1::CacheSettings c;
    c.set_policy("episodic");
    c.set_budget_tokens(32);
    c.set_window(8);
    c.set_episodes(2);
    c.set_embedder("tfidf");
    c.set_block_tokens(64);
    c.set_recluster_turns(1);
    return c;
  }

  std::string dir_;
  ServerProcess worker_;
  ServerProcess coordinator_;
  std::unique_ptr<v1::Chat::Stub> stub_;
};

TEST_F(EpisodicServingTest, EpisodesAreBuiltWhileServingAndReported) {
  const std::string id = Create(Episodic());
  v1::ConverseDone done;
  for (const char* story : kStories) {
    ASSERT_TRUE(Say(id, story, &done).ok());
    EXPECT_FALSE(done.has_episodes()) << "no episodes before the history has two windows";
  }
  // The build runs in the background: within a few more turns they are installed.
  int turns = 4;
  while (!done.has_episodes() && turns < 12) {
    // The context ends after about ten turns of these stories: give the background build
    // time between turns (it was outrun on a loaded machine), rather than more turns.
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    const grpc::Status st = Say(id, kStories[turns % 4], &done);
    ASSERT_TRUE(st.ok()) << st.error_code() << " " << st.error_message();
    ++turns;
  }
  ASSERT_TRUE(done.has_episodes()) << "episodes never reported after " << turns << " turns";
  EXPECT_EQ(done.episodes().windows_size(), 2);
  EXPECT_GE(done.episodes().active(), 0);
  EXPECT_LT(done.episodes().active(), 2);
  const v1::Session s = Get(id);
  EXPECT_EQ(s.episodes().SerializeAsString(), done.episodes().SerializeAsString());
  EXPECT_EQ(s.turns(), turns);
}

// Compact positions (the default with a budget) take an episodic session past the model's
// context: episodes are built from a history longer than the context (block-wise, the
// positions re-positioned as they go), every turn is answered, and the KV bytes stay within
// the budget, the window, a prefill chunk and the turn.
TEST_F(EpisodicServingTest, AnEpisodicConversationGoesFourTimesPastTheContext) {
  const std::string id = Create(Episodic());
  v1::ConverseDone done;
  int64_t tokens = 0, kv_max = 0;
  int turn = 0, with_episodes = 0;
  for (; turn < 200 && tokens < 4 * 512; ++turn) {
    SCOPED_TRACE(turn);
    const grpc::Status st = Say(id, kStories[turn % 4], &done, 24);
    ASSERT_TRUE(st.ok()) << st.error_code() << " " << st.error_message();
    tokens = done.usage().prompt_tokens() + done.usage().generated_tokens();
    kv_max = std::max<int64_t>(kv_max, done.kv_bytes());
    with_episodes += done.has_episodes() ? 1 : 0;
    // Leave the background build time now and then (a loaded machine outruns it).
    if (turn % 8 == 7) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  // budget 32 + window 8 + one prefill chunk (64) + the turn's prompt and reply fed one by
  // one past that, in 16-token blocks over 5 layers of 4 KV heads x 8 x (K, V) x 2 bytes.
  const int64_t block_bytes = 4 * 8 * 2 * 2 * 16;
  const int64_t bound = int64_t{(32 + 8 + 64 + 1 + 15) / 16} * 5 * block_bytes;
  std::printf(
      "episodic past the context: %d turns, %lld tokens (%.1fx 512), %d turns with "
      "episodes, KV at most %lld bytes (bound %lld)\n",
      turn, static_cast<long long>(tokens), tokens / 512.0, with_episodes,
      static_cast<long long>(kv_max), static_cast<long long>(bound));
  // The last episodes cover the transcript's windows of 4 messages: built from a history
  // well past the context (about 4 windows fit in it; measured 12 at the end), not the last
  // build that fit.
  int windows = 0;
  for (const int w : done.episodes().windows()) windows += w;
  std::printf("the last episodes hold %d windows of the %d messages\n", windows, 2 * turn);
  EXPECT_GE(tokens, 4 * 512);
  EXPECT_GT(with_episodes, turn / 2);
  EXPECT_GE(windows, 8) << "episodes were not rebuilt past the context";
  EXPECT_LE(kv_max, bound);
  EXPECT_EQ(Get(id).total_tokens(), tokens);
}

// At the largest budget its context allows (479 of 512 with lazy's window of 32), a session
// switching between its episodes goes on: an episode's cache parked mid-lag (past its budget)
// got a fresh evictor that waited up to a whole window before it evicted, and the cache
// filled the context ("its policy does not evict enough to go on") at turns 8 to 15.
TEST_F(EpisodicServingTest, TheLargestBudgetGoesOnAcrossEpisodeSwitches) {
  v1::CacheSettings cache = Episodic();
  cache.set_budget_tokens(479);
  cache.set_window(32);
  const std::string id = Create(cache);
  v1::ConverseDone done;
  int64_t tokens = 0;
  int turn = 0, with_episodes = 0;
  for (; turn < 60 && tokens < 6 * 512; ++turn) {
    SCOPED_TRACE(turn);
    const grpc::Status st = Say(id, kStories[(turn * 3) % 4], &done, 100);
    ASSERT_TRUE(st.ok()) << st.error_code() << " " << st.error_message();
    tokens = done.usage().prompt_tokens() + done.usage().generated_tokens();
    with_episodes += done.has_episodes() ? 1 : 0;
  }
  EXPECT_GE(tokens, 6 * 512);
  EXPECT_GT(with_episodes, 0);
}

// Refused when the session is made (a worker checks its settings), naming the field.
TEST_F(EpisodicServingTest, BadEpisodicSettingsAreInvalidArgumentNamingTheField) {
  grpc::ClientContext ctx;
  Deadline(&ctx);
  v1::CreateSessionRequest req;
  *req.mutable_cache() = Episodic();
  req.mutable_cache()->set_episodes(40);
  v1::Session s;
  const grpc::Status st = stub_->CreateSession(&ctx, req, &s);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(st.error_message(), "cache.episodes: must be in [1, 16], got 40");
  EXPECT_TRUE(s.session_id().empty());
}

}  // namespace
}  // namespace recall
