// Conversations over a real SQLite store (no workers): a turn stores its messages before it
// runs and builds the spec the worker gets (new messages, history, history_length); a turn
// that keeps less than the transcript rewrites it and sends the history from the first
// attempt; a failed turn is taken back; one turn at a time per session, the mark cleared on
// every path; the turn limit; sessions of another tenant are not found.
#include "coordinator/conversations.h"

#include "gtest/gtest.h"
#include "tests/common/test_util.h"

namespace recall::coordinator {
namespace {

class ConversationsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto store = OpenStore(testing::MakeTempDir("conversations") + "/sessions.db");
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = std::move(*store);
    CoordinatorOptions options;
    options.max_turns = 2;
    conversations_ = std::make_unique<Conversations>(*store_, workers_, options, metrics_);
    auto created = conversations_->Create("t", "", v1::CacheSettings(), {}, "Tell a story.");
    ASSERT_TRUE(created.ok()) << created.status();
    id_ = created->id;
  }

  // A planner that keeps `keep` messages and adds `add`.
  static TurnPlanner Plan(int keep, std::vector<StoredMessage> add) {
    return [keep, add](const SessionRecord&) -> absl::StatusOr<TurnMessages> {
      return TurnMessages{keep, add};
    };
  }

  static TurnResult Reply(const std::string& text) {
    TurnResult r;
    r.text = text;
    r.worker = "w1";
    return r;
  }

  std::vector<StoredMessage> Transcript() {
    auto rec = store_->Get("t", id_);
    EXPECT_TRUE(rec.ok()) << rec.status();
    return rec.ok() ? rec->messages : std::vector<StoredMessage>{};
  }

  metrics::Registry metrics_;
  WorkerRegistry workers_;
  std::unique_ptr<SessionStore> store_;
  std::unique_ptr<Conversations> conversations_;
  std::string id_;
};

TEST_F(ConversationsTest, ATurnStoresItsMessagesFirstAndTheReplyAfter) {
  auto turn =
      conversations_->Begin("t", id_, Plan(1, {{"user", "Hi"}}), v1::SamplingParams(), "http");
  ASSERT_TRUE(turn.ok()) << turn.status();
  EXPECT_EQ(Transcript().size(), 2u) << "the user message is stored before the turn runs";
  const v1::RunTurnRequest& r = turn->spec.request;
  EXPECT_EQ(r.session_id(), id_);
  EXPECT_EQ(r.history_length(), 1);
  ASSERT_EQ(r.messages_size(), 1);
  EXPECT_EQ(r.messages(0).content(), "Hi");
  ASSERT_EQ(turn->spec.history.size(), 1u);
  EXPECT_EQ(turn->spec.history[0].role(), "system");
  EXPECT_FALSE(turn->spec.send_history) << "the transcript was only extended";
  ASSERT_TRUE(conversations_->Finish(*turn, Reply(" Once")).ok());
  const std::vector<StoredMessage> t = Transcript();
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t[2].role, "assistant");
  EXPECT_EQ(t[2].content, " Once");
  EXPECT_EQ(store_->Get("t", id_)->worker, "w1") << "bound to the worker that replied";
}

TEST_F(ConversationsTest, KeepingLessRewritesTheTranscriptAndSendsTheHistory) {
  auto first = conversations_->Begin("t", id_, Plan(1, {{"user", "Hi"}}), {}, "http");
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(conversations_->Finish(*first, Reply(" Once")).ok());
  auto edited = conversations_->Begin(
      "t", id_, Plan(1, {{"user", "Hello"}, {"assistant", "x"}, {"user", "More"}}), {}, "http");
  ASSERT_TRUE(edited.ok()) << edited.status();
  EXPECT_TRUE(edited->spec.send_history) << "a worker's copy of that length may differ";
  EXPECT_EQ(edited->spec.request.history_length(), 1);
  EXPECT_EQ(edited->spec.request.messages_size(), 3);
  const std::vector<StoredMessage> t = Transcript();
  ASSERT_EQ(t.size(), 4u);
  EXPECT_EQ(t[1].content, "Hello");
  // It fails: its messages are taken back; the dropped tail stays dropped.
  ASSERT_TRUE(conversations_->Finish(*edited, absl::UnavailableError("no worker")).ok());
  EXPECT_EQ(Transcript().size(), 1u);
}

TEST_F(ConversationsTest, OneTurnAtATimeAndTheMarkIsClearedOnEveryPath) {
  auto running = conversations_->Begin("t", id_, Plan(1, {{"user", "Hi"}}), {}, "grpc");
  ASSERT_TRUE(running.ok());
  auto second = conversations_->Begin("t", id_, Plan(1, {{"user", "Hi"}}), {}, "grpc");
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(second.status().message().find("is running"), std::string::npos);
  ASSERT_TRUE(conversations_->Finish(*running, absl::CancelledError("gone")).ok());
  // A planner's refusal clears the mark too.
  auto refused = conversations_->Begin(
      "t", id_,
      [](const SessionRecord&) -> absl::StatusOr<TurnMessages> {
        return absl::AbortedError("not this one");
      },
      {}, "http");
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(conversations_->Begin("t", id_, Plan(1, {{"user", "Hi"}}), {}, "http").ok());
}

TEST_F(ConversationsTest, TheTurnLimitAndOtherTenants) {
  auto other = conversations_->Begin("u", id_, Plan(1, {{"user", "Hi"}}), {}, "http");
  EXPECT_EQ(other.status().code(), absl::StatusCode::kNotFound) << "another tenant's session";
  for (int i = 0; i < 2; ++i) {
    auto turn = conversations_->Begin("t", id_, Plan(1 + 2 * i, {{"user", "Hi"}}), {}, "http");
    ASSERT_TRUE(turn.ok()) << turn.status();
    ASSERT_TRUE(conversations_->Finish(*turn, Reply(" ok")).ok());
  }
  auto third = conversations_->Begin("t", id_, Plan(5, {{"user", "Hi"}}), {}, "http");
  EXPECT_EQ(third.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(third.status().message().find("limit of 2 turns"), std::string::npos) << third.status();
}

}  // namespace
}  // namespace recall::coordinator
