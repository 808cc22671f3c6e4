// Exact rebuild (replay.h) on stories260K: a session whose cache is dropped between turns and
// rebuilt from its transcript with the replies' tokens gives the same greedy replies as a
// session that kept its cache, for FullKV and for evicting policies (replies cut at stop
// strings included: their turns gave back tokens, and so does the replay), and a failover's resume
// tokens fed as decode steps give the rest of the reply the original would have given. The
// same sessions rebuilt from text alone are also run, and how many of their replies differ
// is printed (not asserted: whether rounding or a different eviction changes a greedy token
// depends on the text). A turn aborted and taken back is replayed from what it fed.
#include "worker/serving/replay.h"

#include <optional>
#include <thread>

#include "gtest/gtest.h"
#include "tests/common/stories260k.h"
#include "worker/serving/scheduler.h"
#include "worker/serving/turn_collect.h"

namespace recall::serving {
namespace {

const char* const kTurns[] = {"Once upon a time", "Then the dog ran to the park.",
                              "What did Lily say?", "And then?"};

class ReplayTest : public recall::testing::Stories260KTest {
 protected:
  void SetUp() override {
    Stories260KTest::SetUp();
    if (model_ == nullptr) return;
    backend_ = kernels::CreateCpuBackend({2});
    const model::ModelConfig& c = model_->config;
    auto pool = cache::BlockPool::Create({c.n_layers, c.n_kv_heads, c.head_dim, 16}, 4096);
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = std::move(*pool);
    SchedulerOptions o;
    o.stop_token_ids = {2};
    auto s = Scheduler::Create(*model_, *backend_, *pool_, *tok_, o);
    ASSERT_TRUE(s.ok()) << s.status();
    sched_ = std::move(*s);
  }

  TurnRequest Turn(const std::string& session, const std::string& text, int history_length,
                   const std::string& policy) {
    TurnRequest r;
    r.session_id = session;
    r.messages = {{"user", text}};
    r.history_length = history_length;
    r.sampling.temperature = 0;
    r.max_tokens = 60;
    if (policy != "full") {
      r.cache.policy = policy;
      r.cache.budget_tokens = 40;
      r.cache.window = 8;
    } else {
      r.cache.policy = "full";
    }
    return r;
  }

  Collected Run(TurnRequest r) {
    auto stream = sched_->Submit(std::move(r));
    if (!stream.ok()) return Collected{.status = stream.status()};
    return CollectTurn(**stream);
  }

  // Runs kTurns on `session`. Before every turn after the first its cache is dropped and the
  // turn carries the transcript: with the replies' tokens when `with_tokens`, as text only
  // otherwise. `drop` false keeps the cache (the reference). Returns each reply.
  std::vector<Collected> Conversation(const std::string& session, const std::string& policy,
                                      bool drop, bool with_tokens,
                                      const std::vector<std::string>& stop = {}) {
    std::vector<Collected> replies;
    std::vector<model::ChatMessage> history;
    std::vector<std::optional<ReplyRecord>> records;
    for (const char* text : kTurns) {
      TurnRequest r = Turn(session, text, static_cast<int>(history.size()), policy);
      r.stop = stop;
      if (drop && !history.empty()) {
        EXPECT_TRUE(sched_->DropSession(session).ok());
        r.history = history;
        if (with_tokens) r.history_replies = records;
      }
      Collected c = Run(r);
      EXPECT_TRUE(c.status.ok()) << policy << ": " << c.status;
      history.push_back({"user", text});
      history.push_back({"assistant", c.summary.text});
      records.emplace_back();  // the user message
      records.push_back(ReplyRecord{c.token_ids, c.summary.finish});
      replies.push_back(std::move(c));
    }
    return replies;
  }

  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<cache::BlockPool> pool_;
  std::unique_ptr<Scheduler> sched_;
};

TEST_F(ReplayTest, ARebuiltSessionRepliesAsIfItHadKeptItsCache) {
  for (const std::string policy : {"full", "lazy", "h2o", "tova", "streaming", "vase"}) {
    // One session id for the three runs (a policy may seed itself from it, as VaSE does).
    const std::string id = "s-" + policy;
    const std::vector<Collected> kept = Conversation(id, policy, false, false);
    ASSERT_TRUE(sched_->DropSession(id).ok());
    const std::vector<Collected> replayed = Conversation(id, policy, true, true);
    ASSERT_TRUE(sched_->DropSession(id).ok());
    const std::vector<Collected> text = Conversation(id, policy, true, false);
    ASSERT_TRUE(sched_->DropSession(id).ok());
    ASSERT_EQ(kept.size(), replayed.size());
    int text_differs = 0;
    for (size_t i = 0; i < kept.size(); ++i) {
      EXPECT_EQ(replayed[i].token_ids, kept[i].token_ids) << policy << " turn " << i;
      if (i > 0) {
        EXPECT_TRUE(replayed[i].summary.rebuilt) << policy << " turn " << i;
      }
      text_differs += text[i].token_ids != kept[i].token_ids;
    }
    std::printf(
        "%-9s replayed: %zu of %zu replies equal to the kept cache's; rebuilt from "
        "text: %d differ\n",
        policy.c_str(), kept.size(), kept.size(), text_differs);
  }
}

// A turn that brought a reply the client wrote (an exchange before its question, as an
// OpenAI client's list can): that reply has no record, and is replayed as the text of its
// turn, as the turn fed it. It made the whole rebuild a prefill of the rendering, which
// differs from the kept cache once a policy evicts.
TEST_F(ReplayTest, AReplyTheClientWroteIsReplayedAsTheTextOfItsTurn) {
  const std::vector<std::vector<model::ChatMessage>> turns = {
      {{"user", kTurns[0]}},
      {{"user", kTurns[1]}, {"assistant", " The cat sat on the mat."}, {"user", kTurns[2]}},
      {{"user", kTurns[3]}}};
  for (const std::string policy : {"full", "lazy", "h2o"}) {
    const std::string id = "w-" + policy;
    auto conversation = [&](bool drop) {
      std::vector<Collected> replies;
      std::vector<model::ChatMessage> history;
      std::vector<std::optional<ReplyRecord>> records;
      for (const std::vector<model::ChatMessage>& messages : turns) {
        TurnRequest r = Turn(id, "", static_cast<int>(history.size()), policy);
        r.messages = messages;
        if (drop && !history.empty()) {
          EXPECT_TRUE(sched_->DropSession(id).ok());
          r.history = history;
          r.history_replies = records;
        }
        Collected c = Run(r);
        EXPECT_TRUE(c.status.ok()) << policy << ": " << c.status;
        for (const model::ChatMessage& m : messages) {
          history.push_back(m);
          records.emplace_back();  // no record: the client's
        }
        history.push_back({"assistant", c.summary.text});
        records.push_back(ReplyRecord{c.token_ids, c.summary.finish});
        replies.push_back(std::move(c));
      }
      EXPECT_TRUE(sched_->DropSession(id).ok());
      return replies;
    };
    const std::vector<Collected> kept = conversation(false);
    const std::vector<Collected> replayed = conversation(true);
    ASSERT_EQ(kept.size(), replayed.size());
    for (size_t i = 1; i < kept.size(); ++i) {
      EXPECT_TRUE(replayed[i].summary.rebuilt) << policy << " turn " << i;
      EXPECT_EQ(replayed[i].token_ids, kept[i].token_ids) << policy << " turn " << i;
    }
  }
}

// Replies cut at stop strings, between tokens (". ") and inside one ("ed " in " played in"):
// the kept cache gave back the tokens after each cut, and the replay gives them back alike.
TEST_F(ReplayTest, RepliesCutAtStopStringsAreReplayedWithTheTokensTheirTurnsGaveBack) {
  const std::vector<std::string> stop = {". ", "ed "};
  int cut = 0;
  for (const std::string policy : {"full", "lazy", "h2o", "tova", "streaming", "vase"}) {
    const std::string id = "cut-" + policy;
    const std::vector<Collected> kept = Conversation(id, policy, false, false, stop);
    ASSERT_TRUE(sched_->DropSession(id).ok());
    const std::vector<Collected> replayed = Conversation(id, policy, true, true, stop);
    ASSERT_TRUE(sched_->DropSession(id).ok());
    ASSERT_EQ(kept.size(), replayed.size());
    for (size_t i = 0; i < kept.size(); ++i) {
      EXPECT_EQ(replayed[i].token_ids, kept[i].token_ids) << policy << " turn " << i;
      EXPECT_EQ(replayed[i].summary.prompt_tokens, kept[i].summary.prompt_tokens)
          << policy << " turn " << i;
      EXPECT_FALSE(kept[i].summary.rebuilt) << policy << " turn " << i;
      cut += kept[i].summary.finish == TurnFinish::kStop &&
             testing::CutAtStopString(*tok_, kept[i].token_ids, kept[i].text);
    }
  }
  EXPECT_GE(cut, 12) << "replies cut at a stop string, of 24";
}

TEST_F(ReplayTest, ResumeTokensAreFedAsTheDecodeStepsTheyWere) {
  for (const std::string policy : {"full", "lazy"}) {
    TurnRequest whole_request = Turn("whole-" + policy, "Once upon a time", 0, policy);
    whole_request.max_tokens = 120;
    const Collected whole = Run(whole_request);
    ASSERT_TRUE(whole.status.ok()) << whole.status;
    ASSERT_GT(whole.token_ids.size(), 60u);
    TurnRequest r = Turn("resumed-" + policy, "Once upon a time", 0, policy);
    r.max_tokens = 120;
    r.resume_tokens.assign(whole.token_ids.begin(), whole.token_ids.begin() + 50);
    const Collected rest = Run(r);
    ASSERT_TRUE(rest.status.ok()) << rest.status;
    const std::vector<int32_t> expected(whole.token_ids.begin() + 50, whole.token_ids.end());
    EXPECT_EQ(rest.token_ids, expected) << policy;
  }
}

// A turn of an evicting session aborted mid-reply (its client stopped it) is taken back: the
// session goes on from its cache, which keeps what the turn's steps evicted, and the worker
// keeps what the turn fed for the Abort's answer. A rebuild whose history carries that record
// after the reply before it feeds the same tokens and gives them back: its next replies are
// those of the session that kept its cache. Without eviction nothing needs recording.
TEST_F(ReplayTest, AbortedTurnsAreReplayedAsTheirTurnsGaveThemBack) {
  for (const std::string policy : {"full", "lazy", "h2o", "tova", "streaming", "vase"}) {
    const std::string id = "abort-" + policy;
    const Collected first = Run(Turn(id, kTurns[0], 0, policy));
    ASSERT_TRUE(first.status.ok()) << policy << ": " << first.status;
    TurnRequest stopped = Turn(id, kTurns[1], 2, policy);
    stopped.request_id = "stopped-" + policy;
    // Long enough to be running when the reader has its first 8 tokens (60 ended in 6 ms,
    // all of it in the reader's first update, on an idle machine now and then).
    stopped.max_tokens = 300;
    auto stream = sched_->Submit(stopped);
    ASSERT_TRUE(stream.ok()) << stream.status();
    size_t streamed = 0;  // a few decode steps in
    for (TurnUpdate update; streamed < 8;) {
      ASSERT_TRUE((*stream)->Next(absl::Seconds(30), &update));
      ASSERT_FALSE(update.done) << policy << ": a reply of 300 tokens";
      streamed += update.token_ids.size();
    }
    ASSERT_EQ(sched_->AbortRequest(stopped.request_id), 1);
    EXPECT_EQ(CollectTurn(**stream).status.code(), absl::StatusCode::kCancelled);
    const std::optional<TakenBackTurn> taken_back = sched_->TakeTakenBack(stopped.request_id);
    // Kept cache: two more turns.
    const Collected kept2 = Run(Turn(id, kTurns[2], 2, policy));
    const Collected kept3 = Run(Turn(id, kTurns[3], 4, policy));
    ASSERT_TRUE(kept2.status.ok() && kept3.status.ok()) << policy;
    EXPECT_FALSE(kept2.summary.rebuilt) << policy << ": the aborted turn was taken back";
    if (policy == "full") {
      EXPECT_FALSE(taken_back.has_value()) << "without eviction nothing needs replaying";
      ASSERT_TRUE(sched_->DropSession(id).ok());
      continue;
    }
    ASSERT_TRUE(taken_back.has_value()) << policy;
    const TakenBackTurn* taken = &*taken_back;
    EXPECT_GT(taken->prompt_tokens, 0) << policy;
    EXPECT_GT(taken->token_ids.size(), static_cast<size_t>(taken->prompt_tokens))
        << policy << ": it fed reply tokens as decode steps";
    EXPECT_FALSE(sched_->TakeTakenBack(stopped.request_id).has_value()) << "answered once";

    // Rebuilt from the transcript with the record, then the same last turn.
    ASSERT_TRUE(sched_->DropSession(id).ok());
    ReplyRecord reply{first.token_ids, first.summary.finish, {*taken}};
    TurnRequest rebuild = Turn(id, kTurns[2], 2, policy);
    rebuild.history = {{"user", kTurns[0]}, {"assistant", first.summary.text}};
    rebuild.history_replies = {std::nullopt, reply};
    const Collected again2 = Run(rebuild);
    const Collected again3 = Run(Turn(id, kTurns[3], 4, policy));
    ASSERT_TRUE(again2.status.ok() && again3.status.ok()) << policy;
    EXPECT_TRUE(again2.summary.rebuilt) << policy;
    EXPECT_EQ(again2.token_ids, kept2.token_ids) << policy;
    EXPECT_EQ(again3.token_ids, kept3.token_ids) << policy;
    EXPECT_EQ(again3.summary.held_tokens, kept3.summary.held_tokens) << policy;
    EXPECT_EQ(again3.summary.evicted_tokens, kept3.summary.evicted_tokens) << policy;

    // Without the record: how far the rebuild strays (printed: greedy tokens may not show it).
    ASSERT_TRUE(sched_->DropSession(id).ok());
    rebuild.history_replies = {std::nullopt, ReplyRecord{first.token_ids, first.summary.finish}};
    const Collected unrecorded = Run(rebuild);
    ASSERT_TRUE(unrecorded.status.ok()) << policy;
    ASSERT_TRUE(sched_->DropSession(id).ok());
    std::printf(
        "%-9s aborted turn: %d prompt + %zu reply tokens taken back; rebuilt without "
        "them: reply %s\n",
        policy.c_str(), taken->prompt_tokens,
        taken->token_ids.size() - static_cast<size_t>(taken->prompt_tokens),
        unrecorded.token_ids == kept2.token_ids ? "the same" : "differs");
  }
}

// An aborted turn of an evicting session whose record no Abort's answer collected (its
// coordinator died, or never asked): the transcript will lack it, so the session is not
// continued but rebuilt from the transcript at its next turn.
TEST_F(ReplayTest, ATakenBackTurnWhoseRecordNobodyCollectedIsRebuilt) {
  const std::string id = "uncollected";
  const Collected first = Run(Turn(id, kTurns[0], 0, "lazy"));
  ASSERT_TRUE(first.status.ok()) << first.status;
  TurnRequest stopped = Turn(id, kTurns[1], 2, "lazy");
  stopped.request_id = "uncollected-stopped";
  stopped.max_tokens = 300;  // running when the abort comes (60 tokens could be done by then)
  auto stream = sched_->Submit(stopped);
  ASSERT_TRUE(stream.ok()) << stream.status();
  TurnUpdate update;
  ASSERT_TRUE((*stream)->Next(absl::Seconds(30), &update));
  ASSERT_EQ(sched_->AbortRequest(stopped.request_id), 1);
  EXPECT_EQ(CollectTurn(**stream).status.code(), absl::StatusCode::kCancelled);
  const Collected without = Run(Turn(id, kTurns[2], 2, "lazy"));
  EXPECT_TRUE(IsHistoryNeeded(without.status)) << without.status;
  TurnRequest rebuild = Turn(id, kTurns[2], 2, "lazy");
  rebuild.history = {{"user", kTurns[0]}, {"assistant", first.summary.text}};
  const Collected with = Run(rebuild);
  ASSERT_TRUE(with.status.ok()) << with.status;
  EXPECT_TRUE(with.summary.rebuilt);
  ASSERT_TRUE(sched_->DropSession(id).ok());
}

// A regenerate: a turn whose history is the transcript before the session's last turn (or
// with that turn's first messages, when it brought several). Without eviction the worker takes
// that turn back and goes on from its cache (it used to rebuild the session), with the reply
// the turn gave. With eviction that turn's steps evicted, which a rebuild for the regenerate
// (a worker that lost the session) could not redo: the session is rebuilt from the
// transcript, and replies as such a worker's does.
TEST_F(ReplayTest, ARegenerateGoesOnFromTheCacheWithoutEvictionAndRebuildsWithIt) {
  for (const std::string policy : {"full", "lazy", "h2o"}) {
    for (const bool several : {false, true}) {
      const std::string id = "regen-" + policy + (several ? "-several" : "");
      SCOPED_TRACE(id);
      const Collected first = Run(Turn(id, kTurns[0], 0, policy));
      ASSERT_TRUE(first.status.ok()) << first.status;
      const std::vector<model::ChatMessage> leading = {{"user", kTurns[1]},
                                                       {"assistant", " The cat sat."}};
      TurnRequest second = Turn(id, kTurns[2], 2, policy);
      if (several) second.messages.insert(second.messages.begin(), leading.begin(), leading.end());
      const Collected last = Run(second);
      ASSERT_TRUE(last.status.ok()) << last.status;
      TurnRequest regenerate = Turn(id, kTurns[2], 2, policy);
      regenerate.history = {{"user", kTurns[0]}, {"assistant", first.summary.text}};
      regenerate.history_replies = {std::nullopt,
                                    ReplyRecord{first.token_ids, first.summary.finish}};
      if (several) {
        regenerate.history.insert(regenerate.history.end(), leading.begin(), leading.end());
        regenerate.history_replies.insert(regenerate.history_replies.end(), 2, std::nullopt);
        regenerate.history_length = 4;
      }
      const Collected again = Run(regenerate);
      ASSERT_TRUE(again.status.ok()) << again.status;
      if (policy == "full") {
        EXPECT_FALSE(again.summary.rebuilt) << "the last turn was taken back";
        EXPECT_EQ(again.summary.cached_tokens, last.summary.cached_tokens);
        EXPECT_EQ(again.summary.prompt_tokens, last.summary.prompt_tokens);
        EXPECT_EQ(again.token_ids, last.token_ids) << "the same cache: the same reply";
      } else {
        EXPECT_TRUE(again.summary.rebuilt);
        ASSERT_TRUE(sched_->DropSession(id).ok());
        const Collected lost = Run(regenerate);  // a worker without the session
        ASSERT_TRUE(lost.status.ok()) << lost.status;
        EXPECT_EQ(again.token_ids, lost.token_ids);
      }
      ASSERT_TRUE(sched_->DropSession(id).ok());
    }
  }
}

}  // namespace
}  // namespace recall::serving
