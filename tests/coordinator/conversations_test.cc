// Conversations over a real SQLite store (no workers): a turn stores its messages and its
// reply's place (in progress) before it runs and builds the spec the worker gets (new
// messages, history, history_length); a turn that keeps less than the transcript rewrites it
// and sends the history from the first attempt; a failed turn is kept, marked failed, an
// interrupted one with what was sent, and neither is in a later prompt; a coordinator's
// restart marks turns left in progress interrupted; one turn at a time per session, the mark
// cleared on every path; the turn limit; sessions of another tenant are not found.
#include "coordinator/conversations.h"

#include <sqlite3.h>

#include <atomic>
#include <thread>
#include <vector>

#include "absl/strings/cord.h"
#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"

namespace recall::coordinator {
namespace {

class ConversationsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = testing::MakeTempDir("conversations") + "/sessions.db";
    auto store = OpenStore(path_);
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
  std::string path_;
  std::string id_;
};

// A tenant's sessions stay within --max-sessions under concurrent creation: 16 threads each
// make sessions at once and exactly the limit are made, the rest refused RESOURCE_EXHAUSTED
// (a burst of HTTP requests naming no session left 10 under a limit of 3). Another tenant is
// not held back by them.
TEST_F(ConversationsTest, ConcurrentCreationsStayWithinTheTenantsLimit) {
  CoordinatorOptions options;
  options.max_sessions_per_tenant = 3;
  Conversations limited(*store_, workers_, options, metrics_);
  std::atomic<int> made{0}, refused{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 16; ++i) {
    threads.emplace_back([&] {
      for (int k = 0; k < 4; ++k) {
        auto s = limited.Create("burst", "", v1::CacheSettings(), {}, "");
        if (s.ok()) {
          ++made;
        } else {
          EXPECT_EQ(s.status().code(), absl::StatusCode::kResourceExhausted) << s.status();
          ++refused;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(made.load(), 3);
  EXPECT_EQ(refused.load(), 61);
  EXPECT_EQ(*store_->CountSessions("burst"), 3);
  EXPECT_TRUE(limited.Create("other", "", v1::CacheSettings(), {}, "").ok());
}

TEST_F(ConversationsTest, ATurnStoresItsMessagesFirstAndTheReplyAfter) {
  auto turn =
      conversations_->Begin("t", id_, Plan(1, {{"user", "Hi"}}), v1::SamplingParams(), "http");
  ASSERT_TRUE(turn.ok()) << turn.status();
  {
    const std::vector<StoredMessage> t = Transcript();
    ASSERT_EQ(t.size(), 3u) << "the user message and the reply's place, before the turn runs";
    EXPECT_EQ(t[2].role, "assistant");
    EXPECT_EQ(t[2].state, TurnState::kInProgress);
    EXPECT_GT(t[2].lease_unix_ms, 0);
  }
  EXPECT_EQ(turn->reply_index, 2);
  const v1::RunTurnRequest& r = turn->spec.request;
  EXPECT_EQ(r.session_id(), id_);
  EXPECT_EQ(r.history_length(), 1);
  ASSERT_EQ(r.messages_size(), 1);
  EXPECT_EQ(r.messages(0).content(), "Hi");
  ASSERT_EQ(turn->spec.history.size(), 1u);
  EXPECT_EQ(turn->spec.history[0].role(), "system");
  EXPECT_FALSE(turn->spec.send_history) << "the transcript was only extended";
  ASSERT_TRUE(conversations_->Finish(*turn, Reply(" Once"), {}).ok());
  const std::vector<StoredMessage> t = Transcript();
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t[2].role, "assistant");
  EXPECT_EQ(t[2].content, " Once");
  EXPECT_EQ(t[2].state, TurnState::kComplete);
  EXPECT_EQ(store_->Get("t", id_)->worker, "w1") << "bound to the worker that replied";
}

TEST_F(ConversationsTest, KeepingLessRewritesTheTranscriptAndSendsTheHistory) {
  auto first = conversations_->Begin("t", id_, Plan(1, {{"user", "Hi"}}), {}, "http");
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(conversations_->Finish(*first, Reply(" Once"), {}).ok());
  auto edited = conversations_->Begin(
      "t", id_, Plan(1, {{"user", "Hello"}, {"assistant", "x"}, {"user", "More"}}), {}, "http");
  ASSERT_TRUE(edited.ok()) << edited.status();
  EXPECT_TRUE(edited->spec.send_history) << "a worker's copy of that length may differ";
  EXPECT_EQ(edited->spec.request.history_length(), 1);
  EXPECT_EQ(edited->spec.request.messages_size(), 3);
  std::vector<StoredMessage> t = Transcript();
  ASSERT_EQ(t.size(), 5u);
  EXPECT_EQ(t[1].content, "Hello");
  // It fails before any token: kept, marked failed; the dropped tail stays dropped.
  ASSERT_TRUE(conversations_->Finish(*edited, absl::UnavailableError("no worker"), {}).ok());
  t = Transcript();
  ASSERT_EQ(t.size(), 5u);
  EXPECT_EQ(t[4].state, TurnState::kFailed);
  EXPECT_EQ(t[4].content, "");
  // The next turn's prompt holds the complete turns only: the system prompt, and "Hello" with
  // the client's "x"; not "More", whose turn failed.
  const std::vector<StoredMessage> prompt = CompleteTurns(t, 5);
  ASSERT_EQ(prompt.size(), 3u);
  EXPECT_EQ(prompt[1].content, "Hello");
  EXPECT_EQ(prompt[2].content, "x");
  // (This fixture's limit is 2 turns: keep the first four messages for the next one.)
  auto next = conversations_->Begin("t", id_, Plan(3, {{"user", "Again"}}), {}, "grpc");
  ASSERT_TRUE(next.ok()) << next.status();
  ASSERT_EQ(next->spec.history.size(), 3u);
  EXPECT_EQ(next->spec.history[2].content(), "x");
  EXPECT_EQ(next->spec.request.history_length(), 3);
  EXPECT_TRUE(next->spec.send_history) << "the worker's copy may hold the failed turn";
}

// A turn that replaced the transcript's tail and is then refused before any reply (a code a
// retry cannot fix) is taken back: its messages go, and the tail it replaced comes back as it
// was stored (nothing already accepted is lost).
TEST_F(ConversationsTest, ARefusedTurnPutsBackTheMessagesItReplaced) {
  auto first = conversations_->Begin("t", id_, Plan(1, {{"user", "Hi"}}), {}, "http");
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(conversations_->Finish(*first, Reply(" Once"), {}).ok());
  const std::vector<StoredMessage> before = Transcript();
  ASSERT_EQ(before.size(), 3u);
  auto edited = conversations_->Begin("t", id_, Plan(1, {{"user", "Hello"}}), {}, "http");
  ASSERT_TRUE(edited.ok()) << edited.status();
  ASSERT_EQ(edited->replaced.size(), 2u);
  ASSERT_EQ(Transcript()[1].content, "Hello");
  ASSERT_TRUE(
      conversations_->Finish(*edited, absl::FailedPreconditionError("the worker refused it"), {})
          .ok());
  const std::vector<StoredMessage> after = Transcript();
  ASSERT_EQ(after.size(), before.size());
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_EQ(after[i].role, before[i].role) << i;
    EXPECT_EQ(after[i].content, before[i].content) << i;
    EXPECT_EQ(after[i].state, before[i].state) << i;
  }
}

TEST_F(ConversationsTest, AnInterruptedTurnKeepsWhatWasSentAndLeavesLaterPrompts) {
  auto turn = conversations_->Begin("t", id_, Plan(1, {{"user", "Hi"}}), {}, "grpc");
  ASSERT_TRUE(turn.ok());
  StoredMessage sent{"assistant", " Once upon"};
  sent.token_ids = {11, 12};
  ASSERT_TRUE(
      conversations_->Finish(*turn, absl::CancelledError("the client went away"), sent).ok());
  std::vector<StoredMessage> t = Transcript();
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t[2].state, TurnState::kInterrupted);
  EXPECT_EQ(t[2].content, " Once upon");
  EXPECT_EQ(t[2].token_ids, (std::vector<int32_t>{11, 12}));
  auto next = conversations_->Begin("t", id_, Plan(3, {{"user", "Hi again"}}), {}, "grpc");
  ASSERT_TRUE(next.ok());
  ASSERT_EQ(next->spec.history.size(), 1u) << "only the system prompt: no orphaned \"Hi\"";
  EXPECT_EQ(next->spec.request.history_length(), 1);
  EXPECT_TRUE(next->spec.send_history);
  EXPECT_EQ(next->reply_index, 4);
  // The coordinator dies with this turn streaming: the next start marks it interrupted.
  conversations_.reset();
  auto marked = store_->InterruptInProgress();
  ASSERT_TRUE(marked.ok()) << marked.status();
  EXPECT_EQ(*marked, 1);
  t = Transcript();
  ASSERT_EQ(t.size(), 5u);
  EXPECT_EQ(t[4].state, TurnState::kInterrupted);
  EXPECT_EQ(*store_->InterruptInProgress(), 0) << "nothing left in progress";
}

// A stopped turn whose worker took it back (an evicting session: the Abort's answer rides on
// the CANCELLED status) keeps that record with its interrupted reply; the turn that replaces
// it (the list sent again, or with the part of the reply the client kept and a new message)
// carries it to its own reply, and a history sent for that turn or a later one holds it on
// the model's last reply before it (not on the part the client wrote, which has no record).
TEST_F(ConversationsTest, ATakenBackAttemptStaysWithTheTurnThatReplacesIt) {
  CoordinatorOptions options;
  options.max_turns = 10;
  conversations_ = std::make_unique<Conversations>(*store_, workers_, options, metrics_);
  auto first = conversations_->Begin("t", id_, Plan(1, {{"user", "Hi"}}), {}, "grpc");
  ASSERT_TRUE(first.ok());
  TurnResult once = Reply(" Once");
  once.tokens = {5};
  once.done.set_finish_reason(v1::FINISH_REASON_LENGTH);
  ASSERT_TRUE(conversations_->Finish(*first, once, {}).ok());
  for (const bool with_part : {false, true}) {
    SCOPED_TRACE(with_part ? "the part and a new message" : "the list again");
    auto stopped = conversations_->Begin("t", id_, Plan(3, {{"user", "More"}}), {}, "http");
    ASSERT_TRUE(stopped.ok());
    v1::AbortResponse answer;
    v1::TakenBackTurn* taken = answer.add_taken_back();
    taken->add_token_ids(7);
    taken->add_token_ids(8);
    taken->set_prompt_tokens(1);
    absl::Status cancelled = absl::CancelledError("the client cancelled the turn");
    WithTakenBack(answer, cancelled);
    StoredMessage sent{"assistant", " A"};
    sent.token_ids = {8};
    ASSERT_TRUE(conversations_->Finish(*stopped, cancelled, sent).ok());
    std::vector<StoredMessage> t = Transcript();
    ASSERT_EQ(t.size(), 5u);
    ASSERT_EQ(t[4].taken_back.size(), 1u);
    EXPECT_EQ(t[4].taken_back[0].token_ids, (std::vector<int32_t>{7, 8}));
    EXPECT_EQ(t[4].taken_back[0].prompt_tokens, 1);

    std::vector<StoredMessage> add = {{"user", "More"}};
    if (with_part) add.insert(add.end(), {{"assistant", " A"}, {"user", "Go on"}});
    auto again = conversations_->Begin("t", id_, Plan(3, add), {}, "http");
    ASSERT_TRUE(again.ok());
    ASSERT_EQ(again->earlier_attempts.size(), 1u) << "carried from the stopped turn it replaces";
    ASSERT_EQ(again->spec.history.size(), 3u);
    EXPECT_EQ(again->spec.history[2].taken_back_after_size(), 1)
        << "a worker rebuilding the session for this turn replays it too";
    ASSERT_TRUE(conversations_->Finish(*again, Reply(" B"), {}).ok());
    t = Transcript();
    const size_t reply = 3 + add.size();
    ASSERT_EQ(t.size(), reply + 1);
    ASSERT_EQ(t[reply].taken_back.size(), 1u);
    EXPECT_EQ(t[reply].taken_back[0].token_ids, (std::vector<int32_t>{7, 8}));
    auto next = conversations_->Begin(
        "t", id_, Plan(static_cast<int>(reply) + 1, {{"user", "And?"}}), {}, "grpc");
    ASSERT_TRUE(next.ok());
    ASSERT_EQ(next->spec.history.size(), reply + 1);
    EXPECT_EQ(next->spec.history[2].taken_back_after_size(), 1)
        << "on the model's reply kept before the attempt";
    for (size_t i = 3; i < next->spec.history.size(); ++i) {
      EXPECT_EQ(next->spec.history[i].taken_back_after_size(), 0) << i;
    }
    ASSERT_TRUE(conversations_->Finish(*next, absl::InvalidArgumentError("no"), {}).ok());
    // Back to one turn for the next round.
    ASSERT_TRUE(store_->ReplaceTail("t", id_, 3, static_cast<int>(reply) + 1, {}, "").ok());
  }
}

// A turn whose client left (Ending: the HTTP client stopped the reply) is waited for by its
// session's next turn, which then finds it stored (interrupted); before, the next turn found
// the session running (a client naming no session got a new one).
TEST_F(ConversationsTest, ATurnWhoseClientLeftIsWaitedForByTheNextTurn) {
  auto turn = conversations_->Begin("t", id_, Plan(1, {{"user", "Hi"}}), {}, "http");
  ASSERT_TRUE(turn.ok());
  EXPECT_FALSE(conversations_->Begin("t", id_, Plan(3, {{"user", "Hi again"}}), {}, "http").ok())
      << "running";
  conversations_->Ending(*turn);
  StoredMessage sent{"assistant", " Once upon"};
  sent.token_ids = {11, 12};
  std::thread worker_let_go([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    EXPECT_TRUE(
        conversations_->Finish(*turn, absl::CancelledError("the client went away"), sent).ok());
  });
  auto next = conversations_->Begin("t", id_, Plan(3, {{"user", "Hi again"}}), {}, "http");
  worker_let_go.join();
  ASSERT_TRUE(next.ok()) << next.status();
  const std::vector<StoredMessage> t = Transcript();
  ASSERT_EQ(t.size(), 5u) << "and the new turn's reply, in progress";
  EXPECT_EQ(t[2].state, TurnState::kInterrupted);
  EXPECT_EQ(t[3].content, "Hi again");
}

TEST_F(ConversationsTest, ATurnBegunFromTheRecentTurnsSendsWhatTheWholeTranscriptGives) {
  CoordinatorOptions options;
  options.max_turns = 100;
  conversations_ = std::make_unique<Conversations>(*store_, workers_, options, metrics_);
  // Turns, the third interrupted and the fifth failed (left out of prompts).
  for (int i = 0; i < 8; ++i) {
    auto turn = conversations_->Begin(
        "t", id_, Plan(1 + 2 * i, {{"user", "Q" + std::to_string(i)}}), {}, "grpc", "");
    ASSERT_TRUE(turn.ok()) << turn.status();
    // From the second turn on the recent turns start after the first: the history is read
    // when a worker needs it.
    EXPECT_EQ(turn->spec.history.empty(), i >= 2) << "turn " << i;
    EXPECT_EQ(static_cast<bool>(turn->spec.fetch_history), i >= 2) << "turn " << i;
    StoredMessage sent{"assistant", i == 2 ? " part" : ""};
    if (i == 2 || i == 4) {
      ASSERT_TRUE(conversations_->Finish(*turn, absl::UnavailableError("worker lost"), sent).ok());
    } else {
      ASSERT_TRUE(conversations_->Finish(*turn, Reply(" A" + std::to_string(i)), {}).ok());
    }
  }
  const auto begin = [&](std::optional<std::string> recent) {
    v1::SamplingParams seeded;
    seeded.set_seed(7);
    return conversations_->Begin("t", id_, Plan(17, {{"user", "last"}}), seeded, "grpc", recent);
  };
  auto recent = begin("");
  ASSERT_TRUE(recent.ok()) << recent.status();
  ASSERT_TRUE(recent->spec.fetch_history) << "the history is read later";
  absl::Notification read;
  absl::StatusOr<std::vector<v1::ChatMessage>> fetched;
  recent->spec.fetch_history([&](absl::StatusOr<std::vector<v1::ChatMessage>> h) {
    fetched = std::move(h);
    read.Notify();
  });
  ASSERT_TRUE(read.WaitForNotificationWithTimeout(absl::Seconds(10)));
  ASSERT_TRUE(fetched.ok()) << fetched.status();
  // Taken back (refused before any reply), then begun again from the whole transcript.
  ASSERT_TRUE(conversations_->Finish(*recent, absl::InvalidArgumentError("no"), {}).ok());
  auto whole = begin(std::nullopt);
  ASSERT_TRUE(whole.ok()) << whole.status();
  EXPECT_FALSE(whole->spec.fetch_history);
  EXPECT_EQ(recent->spec.request.history_length(), whole->spec.request.history_length());
  EXPECT_EQ(recent->spec.request.history_length(), 17 - 2 - 2)
      << "the interrupted and the failed turns' messages are left out";
  EXPECT_EQ(recent->spec.send_history, whole->spec.send_history);
  ASSERT_EQ(fetched->size(), whole->spec.history.size());
  for (size_t i = 0; i < fetched->size(); ++i) {
    EXPECT_EQ((*fetched)[i].SerializeAsString(), whole->spec.history[i].SerializeAsString())
        << "history message " << i;
  }
  EXPECT_EQ(recent->spec.request.SerializeAsString(), whole->spec.request.SerializeAsString());
}

// A turn of a session that evicts, interrupted with its worker's record of the attempt taken
// back (own: an attempt of that very reply), then resumed twice: the resume's history leaves
// its own attempts out and the worker is asked to rebuild (its cache went through them), so
// the reply is the one without the interruption; interrupted again, the reply keeps every own
// attempt; complete, none. A turn that replaces it instead carries the attempt on (not own).
TEST_F(ConversationsTest, AResumeLeavesItsOwnTakenBackAttemptsOutAndHasTheWorkerRebuild) {
  StoredMessage user{"user", "Hi"};
  user.turn_id = "t-1";
  auto turn = conversations_->Begin("t", id_, Plan(1, {user}), {}, "grpc");
  ASSERT_TRUE(turn.ok());
  EXPECT_FALSE(turn->spec.request.rebuild());
  const auto interrupt = [&](const OpenTurn& t, int32_t token) {
    v1::AbortResponse answer;
    v1::TakenBackTurn* taken = answer.add_taken_back();
    taken->add_token_ids(token);
    taken->set_prompt_tokens(1);
    absl::Status cancelled = absl::CancelledError("the client went away");
    WithTakenBack(answer, cancelled);
    StoredMessage sent{"assistant", " Once"};
    sent.token_ids = {11};
    return conversations_->Finish(t, cancelled, sent);
  };
  ASSERT_TRUE(interrupt(*turn, 7).ok());
  std::vector<StoredMessage> t = Transcript();
  ASSERT_EQ(t.size(), 3u);
  ASSERT_EQ(t[2].taken_back.size(), 1u);
  EXPECT_TRUE(t[2].taken_back[0].own);

  auto resumed = conversations_->Resume("t", id_, "turn_id", "t-1", {}, "grpc");
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_TRUE(resumed->spec.request.rebuild());
  EXPECT_TRUE(resumed->earlier_attempts.empty());
  ASSERT_EQ(resumed->own_attempts.size(), 1u);
  for (const v1::ChatMessage& m : resumed->spec.history) EXPECT_EQ(m.taken_back_after_size(), 0);
  ASSERT_TRUE(interrupt(*resumed, 8).ok());
  t = Transcript();
  ASSERT_EQ(t[2].taken_back.size(), 2u) << "the first attempt and the resume's";
  EXPECT_TRUE(t[2].taken_back[0].own && t[2].taken_back[1].own);

  auto again = conversations_->Resume("t", id_, "turn_id", "t-1", {}, "grpc");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE(again->spec.request.rebuild());
  EXPECT_EQ(again->own_attempts.size(), 2u);
  ASSERT_TRUE(conversations_->Finish(*again, Reply(" Once upon"), {}).ok());
  EXPECT_TRUE(Transcript()[2].taken_back.empty()) << "the reply is the one without them";

  // Interrupted again in a later turn, then replaced by the next turn: the attempt was in the
  // worker's cache when that turn began, and stays with it.
  StoredMessage more{"user", "More"};
  more.turn_id = "t-2";
  auto second = conversations_->Begin("t", id_, Plan(3, {more}), {}, "http");
  ASSERT_TRUE(second.ok());
  ASSERT_TRUE(interrupt(*second, 9).ok());
  auto replacing = conversations_->Begin("t", id_, Plan(3, {{"user", "More"}}), {}, "http");
  ASSERT_TRUE(replacing.ok()) << replacing.status();
  ASSERT_EQ(replacing->earlier_attempts.size(), 1u);
  EXPECT_FALSE(replacing->earlier_attempts[0].own);
  EXPECT_FALSE(replacing->spec.request.rebuild());
}

// Resume: the interrupted last turn named by its id goes back in progress with the part sent,
// its spec sends the same user message with the turns before it and the part as resume
// tokens, and Finish stores the whole reply. A turn the session went on from, a complete
// turn, or an unknown id is refused naming the field.
TEST_F(ConversationsTest, AnInterruptedLastTurnIsResumedFromThePartSent) {
  StoredMessage user{"user", "Hi"};
  user.turn_id = "t-1";
  auto turn = conversations_->Begin("t", id_, Plan(1, {user}), {}, "grpc");
  ASSERT_TRUE(turn.ok());
  StoredMessage sent{"assistant", " Once upon"};
  sent.token_ids = {11, 12};
  ASSERT_TRUE(conversations_->Finish(*turn, absl::CancelledError("went away"), sent).ok());
  auto resumed = conversations_->Resume("t", id_, "turn_id", "t-1", {}, "grpc");
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->reply_index, 2);
  ASSERT_TRUE(resumed->resumed.has_value());
  EXPECT_EQ(resumed->resumed->content, " Once upon");
  EXPECT_EQ(resumed->spec.resume_tokens, (std::vector<int32_t>{11, 12}));
  EXPECT_EQ(resumed->spec.resume_text, " Once upon");
  // The request named no seed: the coordinator drew one for the turn and stored it with the
  // reply, and the resumed turn takes the same draws (the worker skips those of the resumed
  // tokens), so it goes on as the uninterrupted turn would have.
  ASSERT_TRUE(turn->spec.request.sampling().has_seed());
  EXPECT_EQ(resumed->spec.request.sampling().seed(), turn->spec.request.sampling().seed());
  ASSERT_EQ(resumed->spec.request.messages_size(), 1);
  EXPECT_EQ(resumed->spec.request.messages(0).content(), "Hi");
  EXPECT_EQ(resumed->spec.request.history_length(), 1) << "the system prompt";
  EXPECT_TRUE(resumed->spec.send_history);
  std::vector<StoredMessage> t = Transcript();
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t[2].state, TurnState::kInProgress);
  EXPECT_EQ(t[2].content, " Once upon") << "the part sent stays while it runs";
  EXPECT_EQ(t[2].seed, turn->spec.request.sampling().seed());
  EXPECT_EQ(conversations_->Resume("t", id_, "turn_id", "t-1", {}, "grpc").status().code(),
            absl::StatusCode::kFailedPrecondition)
      << "one turn at a time";
  TurnResult whole = Reply(" Once upon a time");
  whole.tokens = {11, 12, 13};
  ASSERT_TRUE(conversations_->Finish(*resumed, whole, {}).ok());
  t = Transcript();
  EXPECT_EQ(t[2].state, TurnState::kComplete);
  EXPECT_EQ(t[2].content, " Once upon a time");
  const auto refused = [&](const std::string& id) {
    return conversations_->Resume("t", id_, "turn_id", id, {}, "grpc").status();
  };
  EXPECT_NE(refused("t-1").message().find("turn_id: \"t-1\" names a turn that is complete"),
            std::string::npos)
      << refused("t-1");
  EXPECT_NE(refused("t-9").message().find("turn_id: \"t-9\" is not in the session"),
            std::string::npos);
  // Interrupted, then the session went on: not resumable.
  StoredMessage second{"user", "More"};
  second.turn_id = "t-2";
  auto two = conversations_->Begin("t", id_, Plan(3, {second}), {}, "grpc");
  ASSERT_TRUE(two.ok()) << two.status();
  ASSERT_TRUE(conversations_->Finish(*two, absl::CancelledError("went away"), sent).ok());
  auto three = conversations_->Begin("t", id_, Plan(5, {{"user", "Again"}}), {}, "grpc");
  ASSERT_FALSE(three.ok()) << "this fixture's limit is two turns";
  ASSERT_TRUE(store_->Append("t", id_, 5, {"user", "Again"}).ok());
  EXPECT_EQ(refused("t-2").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused("t-2").message().find("went on"), std::string::npos) << refused("t-2");
}

// A failed turn (nothing sent) resumed and then refused by the worker (a code a retry cannot
// fix) is not taken out of the transcript: it stays as it was stored, failed.
TEST_F(ConversationsTest, AResumedFailedTurnThatIsRefusedStaysAsStored) {
  StoredMessage user{"user", "Hi"};
  user.turn_id = "t-1";
  auto turn = conversations_->Begin("t", id_, Plan(1, {user}), {}, "grpc");
  ASSERT_TRUE(turn.ok());
  ASSERT_TRUE(conversations_->Finish(*turn, absl::UnavailableError("no worker"), {}).ok());
  auto resumed = conversations_->Resume("t", id_, "turn_id", "t-1", {}, "grpc");
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  ASSERT_TRUE(conversations_->Finish(*resumed, absl::InvalidArgumentError("too long"), {}).ok());
  const std::vector<StoredMessage> t = Transcript();
  ASSERT_EQ(t.size(), 3u) << "the user message is kept";
  EXPECT_EQ(t[1].content, "Hi");
  EXPECT_EQ(t[1].turn_id, "t-1");
  EXPECT_EQ(t[2].state, TurnState::kFailed);
}

TEST_F(ConversationsTest, OneTurnAtATimeAndTheMarkIsClearedOnEveryPath) {
  auto running = conversations_->Begin("t", id_, Plan(1, {{"user", "Hi"}}), {}, "grpc");
  ASSERT_TRUE(running.ok());
  auto second = conversations_->Begin("t", id_, Plan(1, {{"user", "Hi"}}), {}, "grpc");
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(second.status().message().find("is running"), std::string::npos);
  ASSERT_TRUE(conversations_->Finish(*running, absl::CancelledError("gone"), {}).ok());
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

// A session whose stored cache settings do not parse is not run with the defaults (another
// cache than the one asked): the turn is refused, DataLoss naming the session, and nothing is
// written.
TEST_F(ConversationsTest, DamagedCacheSettingsRefuseTheTurn) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "UPDATE sessions SET cache = x'ffffffff'", nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  auto turn =
      conversations_->Begin("t", id_, Plan(1, {{"user", "Hi"}}), v1::SamplingParams(), "http");
  ASSERT_EQ(turn.status().code(), absl::StatusCode::kDataLoss) << turn.status();
  EXPECT_NE(turn.status().message().find("cache settings are damaged"), std::string::npos);
  EXPECT_EQ(Transcript().size(), 1u) << "nothing written";
}

// The same for a resumed turn (Resume builds its spec from the stored settings too).
TEST_F(ConversationsTest, DamagedCacheSettingsRefuseAResume) {
  StoredMessage user{"user", "Hi"};
  user.turn_id = "t-1";
  auto turn = conversations_->Begin("t", id_, Plan(1, {user}), v1::SamplingParams(), "grpc");
  ASSERT_TRUE(turn.ok()) << turn.status();
  ASSERT_TRUE(
      conversations_->Finish(*turn, absl::CancelledError("client left"), {"assistant", " Once"})
          .ok());
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path_.c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "UPDATE sessions SET cache = x'ffffffff'", nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  auto resumed = conversations_->Resume("t", id_, "turn_id", "t-1", v1::SamplingParams(), "grpc");
  ASSERT_EQ(resumed.status().code(), absl::StatusCode::kDataLoss) << resumed.status();
  const std::vector<StoredMessage> t = Transcript();
  ASSERT_EQ(t.size(), 3u);
  EXPECT_EQ(t[2].state, TurnState::kInterrupted) << "left as it was";
}

// A turn on a session that is not there is NOT_FOUND even while a turn runs under its key (a
// tenant sending turns at once on an id it does not have was told, for all but the first,
// that one of its turns was running); a session that is there says its turn runs.
TEST_F(ConversationsTest, ATurnOnASessionThatIsNotThereIsNotFoundWhileAnotherRuns) {
  auto first = conversations_->Begin("t", id_, Plan(1, {{"user", "Hi"}}), {}, "http");
  ASSERT_TRUE(first.ok()) << first.status();
  auto busy = conversations_->Begin("t", id_, Plan(1, {{"user", "Hi"}}), {}, "http");
  EXPECT_EQ(busy.status().code(), absl::StatusCode::kFailedPrecondition) << busy.status();
  ASSERT_TRUE(store_->Delete("t", id_).ok());
  auto gone = conversations_->Begin("t", id_, Plan(1, {{"user", "Hi"}}), {}, "http");
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kNotFound) << gone.status();
}

TEST_F(ConversationsTest, TheTurnLimitAndOtherTenants) {
  auto other = conversations_->Begin("u", id_, Plan(1, {{"user", "Hi"}}), {}, "http");
  EXPECT_EQ(other.status().code(), absl::StatusCode::kNotFound) << "another tenant's session";
  for (int i = 0; i < 2; ++i) {
    auto turn = conversations_->Begin("t", id_, Plan(1 + 2 * i, {{"user", "Hi"}}), {}, "http");
    ASSERT_TRUE(turn.ok()) << turn.status();
    ASSERT_TRUE(conversations_->Finish(*turn, Reply(" ok"), {}).ok());
  }
  auto third = conversations_->Begin("t", id_, Plan(5, {{"user", "Hi"}}), {}, "http");
  EXPECT_EQ(third.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(third.status().message().find("limit of 2 turns"), std::string::npos) << third.status();
  // A conversation of more turns than the limit, in a session of none yet (how an OpenAI
  // client naming no session gets a new one for its whole list): refused too, naming it.
  auto fresh = conversations_->Create("t", "", v1::CacheSettings(), {}, "");
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  auto whole = conversations_->Begin(
      "t", fresh->id,
      Plan(0,
           {{"user", "a"}, {"assistant", "A"}, {"user", "b"}, {"assistant", "B"}, {"user", "c"}}),
      {}, "http");
  EXPECT_EQ(whole.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(whole.status().message().rfind("messages: the conversation has 3 turns", 0), 0u)
      << whole.status();
  auto two = conversations_->Begin(
      "t", fresh->id, Plan(0, {{"user", "a"}, {"assistant", "A"}, {"user", "b"}}), {}, "http");
  EXPECT_TRUE(two.ok()) << two.status();
}

// The turns a list keeps are the user messages it keeps: one that differs from the transcript
// at a reply (the client edited it) keeps the turn before it (counted as none, a session went
// one turn past the limit).
TEST_F(ConversationsTest, TheTurnLimitCountsTheTurnOfAnEditedReply) {
  auto made = conversations_->Create("t", "", v1::CacheSettings(), {}, "");
  ASSERT_TRUE(made.ok()) << made.status();
  for (int i = 0; i < 2; ++i) {
    auto turn = conversations_->Begin("t", made->id, Plan(2 * i, {{"user", "Hi"}}), {}, "http");
    ASSERT_TRUE(turn.ok()) << turn.status();
    ASSERT_TRUE(conversations_->Finish(*turn, Reply(" ok"), {}).ok());
  }
  // The first user message kept, then the first reply edited and two more turns: three.
  auto three = conversations_->Begin(
      "t", made->id,
      Plan(1, {{"assistant", "edited"}, {"user", "b"}, {"assistant", "B"}, {"user", "c"}}), {},
      "http");
  EXPECT_EQ(three.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(three.status().message().rfind("messages: the conversation has 3 turns", 0), 0u)
      << three.status();
  auto two = conversations_->Begin("t", made->id, Plan(1, {{"assistant", "edited"}, {"user", "b"}}),
                                   {}, "http");
  EXPECT_TRUE(two.ok()) << two.status();
}

// A session made for its turn (an HTTP list naming none) whose turn failed before any reply
// (no worker could take it) is deleted, so that a client's retries leave no empty sessions
// behind; one whose client stopped it stays (its user message is kept).
TEST_F(ConversationsTest, ASessionMadeForATurnThatFailedIsDeleted) {
  for (const absl::Status& end : {absl::UnavailableError("no worker could take the turn"),
                                  absl::CancelledError("the client left before the end")}) {
    auto made = conversations_->Create("t", "", v1::CacheSettings(), {}, "");
    ASSERT_TRUE(made.ok()) << made.status();
    auto turn = conversations_->Begin("t", made->id, Plan(0, {{"user", "Hi"}}), {}, "http");
    ASSERT_TRUE(turn.ok()) << turn.status();
    turn->new_session = true;
    ASSERT_TRUE(conversations_->Finish(*turn, end, {}).ok());
    EXPECT_EQ(store_->Get("t", made->id).ok(), absl::IsCancelled(end)) << end;
  }
}

}  // namespace
}  // namespace recall::coordinator
