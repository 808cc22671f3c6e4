// Sessions longer than the model's context (runtime/positions.h): a compact session goes on
// past stories260K's 512 tokens, re-positioning its cache, with its KV bytes bounded by its
// budget, its window and one prefill chunk; a prompt longer than the context is fed in that
// bound; its own copy of the transcript and tokens stays bounded too; an original session
// ends at the context as before; TP ranks give the one-rank tokens.
#include <string>

#include "gtest/gtest.h"
#include "tests/common/compact_lazy.h"
#include "tests/common/stories260k.h"
#include "worker/runtime/engine.h"
#include "worker/serving/scheduler.h"
#include "worker/serving/turn_collect.h"

namespace recall::serving {
namespace {

class EndlessTest : public recall::testing::Stories260KTest {
 protected:
  std::unique_ptr<Scheduler> Start(int tp = 1) {
    runtime::Engine* e = testing::AddEngine(*model_, engines_, tp);
    return e == nullptr ? nullptr : testing::StartCompactLazy(*e, *tok_, &metrics_);
  }

  static TurnRequest Turn(const std::string& session, const std::string& text, int history,
                          int max_tokens = 40) {
    TurnRequest r;
    r.session_id = session;
    r.messages = {{"user", text}};
    r.history_length = history;
    r.sampling.temperature = 0;
    r.max_tokens = max_tokens;
    return r;
  }

  static Collected Run(Scheduler& s, TurnRequest r) {
    auto stream = s.Submit(std::move(r));
    if (!stream.ok()) return Collected{.status = stream.status()};
    return CollectTurn(**stream);
  }

  int64_t Bound() const {
    return testing::CompactLazyBound(model_->config, engines_.back()->pool(0).block_bytes(),
                                     engines_.back()->tp());
  }

  double Compactions() {
    return metrics_.GetCounter("recall_worker_compactions_total", "")->value();
  }

  metrics::Registry metrics_;
  std::vector<std::unique_ptr<runtime::Engine>> engines_;
};

const auto& kLines = testing::kConversationLines;

TEST_F(EndlessTest, ACompactSessionGoesOnPastTheContextInBoundedMemory) {
  if (model_ == nullptr) return;
  std::unique_ptr<Scheduler> s = Start();
  ASSERT_NE(s, nullptr);
  int64_t consumed = 0;
  for (int turn = 0; turn < 30; ++turn) {
    SCOPED_TRACE(turn);
    Collected c = Run(*s, Turn("long", kLines[turn % 6], 2 * turn));
    ASSERT_TRUE(c.status.ok()) << c.status;
    EXPECT_GT(c.summary.generated_tokens, 0);
    EXPECT_LE(c.summary.peak_kv_bytes, Bound());
    consumed += c.summary.prompt_tokens - c.summary.cached_tokens + c.summary.generated_tokens;
  }
  EXPECT_GT(consumed, 3 * model_->config.max_seq_len) << "the session passed the context 3x";
  EXPECT_GE(Compactions(), 3);
}

TEST_F(EndlessTest, ASessionsOwnTranscriptCopyStaysBoundedAndItsHistoryIsStillCompared) {
  if (model_ == nullptr) return;
  std::unique_ptr<Scheduler> s = Start();
  ASSERT_NE(s, nullptr);
  const int context = model_->config.max_seq_len;
  std::vector<model::ChatMessage> transcript;  // as the coordinator keeps it
  Collected c;
  for (int turn = 0; turn < 100; ++turn) {
    SCOPED_TRACE(turn);
    c = Run(*s, Turn("kept", kLines[turn % 6], 2 * turn));
    ASSERT_TRUE(c.status.ok()) << c.status;
    transcript.push_back({"user", kLines[turn % 6]});
    transcript.push_back({"assistant", c.text});
  }
  EXPECT_GT(c.summary.cached_tokens, 4 * context) << "every token fed is counted";
  // The worker's copy: the last turn's messages and at most three times the context of tokens
  // (in a vector of at most four times its capacity), where the session has fed over four
  // times the context (before: all of them, growing).
  const int64_t held = s->Load().transcript_bytes;
  EXPECT_GT(held, 0);
  EXPECT_LE(held, int64_t{4} * 2 * context * 2 + 4096) << "bytes of the session's copies";
  // A request whose history equals the transcript continues the cache (compared by digest);
  // one whose history differs is rebuilt from it.
  TurnRequest same = Turn("kept", "And then?", 200);
  same.history = transcript;
  Collected kept = Run(*s, same);
  ASSERT_TRUE(kept.status.ok()) << kept.status;
  EXPECT_FALSE(kept.summary.rebuilt);
  transcript.push_back({"user", "And then?"});
  transcript.push_back({"assistant", kept.text});
  std::vector<model::ChatMessage> other = transcript;
  other[10].content += " (edited)";
  TurnRequest differs = Turn("kept", "Go on.", 202);
  differs.history = other;
  Collected rebuilt = Run(*s, differs);
  ASSERT_TRUE(rebuilt.status.ok()) << rebuilt.status;
  EXPECT_TRUE(rebuilt.summary.rebuilt);
}

TEST_F(EndlessTest, APromptLongerThanTheContextIsFedWithinTheBound) {
  if (model_ == nullptr) return;
  std::unique_ptr<Scheduler> s = Start();
  ASSERT_NE(s, nullptr);
  std::string text;
  for (int i = 0; i < 60; ++i) text += std::string(kLines[i % 6]) + " ";
  Collected c = Run(*s, Turn("big", text, 0));
  ASSERT_TRUE(c.status.ok()) << c.status;
  EXPECT_GT(c.summary.prompt_tokens, 2 * model_->config.max_seq_len);
  EXPECT_GT(c.summary.generated_tokens, 0);
  EXPECT_LE(c.summary.peak_kv_bytes, Bound());
}

// Budgets up to the largest that leaves the context room for lazy's window and one step go on
// past the context, turn after turn and with a prompt longer than it (at half the context,
// prompt pieces filled the context before any eviction step: "does not evict enough").
TEST_F(EndlessTest, BudgetsUpToTheLargestThatFitsGoOnPastTheContext) {
  if (model_ == nullptr) return;
  runtime::Engine* e = testing::AddEngine(*model_, engines_, 1);
  ASSERT_NE(e, nullptr);
  std::string long_text;
  for (int i = 0; i < 60; ++i) long_text += std::string(kLines[i % 6]) + " ";
  const int context = model_->config.max_seq_len;
  for (const int budget : {context / 2, context - testing::kCompactWindow - 1}) {
    SCOPED_TRACE(budget);
    SchedulerOptions so = testing::CompactLazyOptions();
    so.cache.budget_tokens = budget;
    std::unique_ptr<Scheduler> s = testing::StartCompactLazy(*e, *tok_, &metrics_, so);
    ASSERT_NE(s, nullptr);
    Collected big = Run(*s, Turn("big", long_text, 0));
    ASSERT_TRUE(big.status.ok()) << big.status;
    EXPECT_GT(big.summary.prompt_tokens, 2 * context);
    int64_t consumed = 0;
    for (int turn = 0; turn < 24; ++turn) {
      Collected c = Run(*s, Turn("turns", kLines[turn % 6], 2 * turn));
      ASSERT_TRUE(c.status.ok()) << "turn " << turn << ": " << c.status;
      consumed += c.summary.prompt_tokens - c.summary.cached_tokens + c.summary.generated_tokens;
    }
    EXPECT_GT(consumed, context) << "the turns passed the context";
  }
}

TEST_F(EndlessTest, AnOriginalSessionStillEndsAtTheContext) {
  if (model_ == nullptr) return;
  std::unique_ptr<Scheduler> s = Start();
  ASSERT_NE(s, nullptr);
  absl::Status last;
  int turn = 0;
  for (; turn < 40 && last.ok(); ++turn) {
    TurnRequest r = Turn("orig", kLines[turn % 6], 2 * turn);
    r.cache.positions = "original";
    last = Run(*s, r).status;
  }
  EXPECT_EQ(last.code(), absl::StatusCode::kInvalidArgument) << last;
  EXPECT_NE(last.message().find("tokens of context"), std::string::npos) << last;
  // Its policy evicts: what ends it is its positions (the advice was to choose a policy that
  // evicts, which it had).
  EXPECT_NE(last.message().find("with positions \"compact\""), std::string::npos) << last;
}

// SnapKV evicts at the first prompt only: its compact session cannot go past the context
// either. A reply that reaches it ends there (finish "context", as an original session's),
// and the next turn is refused naming the limit; both failed mid-turn before
// (FAILED_PRECONDITION, "does not evict enough"), which a piped chat took as fatal.
TEST_F(EndlessTest, ASessionWhosePolicyEvictsAtThePromptOnlyEndsAtTheContext) {
  if (model_ == nullptr) return;
  std::unique_ptr<Scheduler> s = Start();
  ASSERT_NE(s, nullptr);
  Collected last;
  int turn = 0;
  bool context_end = false;
  for (; turn < 40; ++turn) {
    TurnRequest r = Turn("snap", kLines[turn % 6], 2 * turn, 200);
    r.cache.policy = "snapkv";
    r.cache.budget_tokens = 64;
    last = Run(*s, r);
    if (!last.status.ok()) break;
    context_end = context_end || last.summary.finish == TurnFinish::kContext;
  }
  EXPECT_TRUE(context_end) << "a reply ended at the context";
  EXPECT_EQ(last.status.code(), absl::StatusCode::kInvalidArgument) << last.status;
  EXPECT_NE(last.status.message().find("start a new session"), std::string::npos) << last.status;
  EXPECT_TRUE(last.token_ids.empty()) << "refused before any token";
  // A first prompt past the context is refused by name too (its rebuild failed mid-prefill).
  std::string words;
  for (int i = 0; i < 700; ++i) words += "a ";
  TurnRequest r = Turn("snap-long", words, 0);
  r.cache.policy = "snapkv";
  r.cache.budget_tokens = 64;
  const Collected long_prompt = Run(*s, r);
  EXPECT_EQ(long_prompt.status.code(), absl::StatusCode::kInvalidArgument) << long_prompt.status;
  EXPECT_NE(long_prompt.status.message().find("context length"), std::string::npos)
      << long_prompt.status;
}

TEST_F(EndlessTest, TensorParallelRanksGiveTheOneRankTokensPastTheContext) {
  if (model_ == nullptr) return;
  std::unique_ptr<Scheduler> one = Start(1);
  std::unique_ptr<Scheduler> two = Start(2);
  std::unique_ptr<Scheduler> four = Start(4);
  ASSERT_NE(one, nullptr);
  ASSERT_NE(two, nullptr);
  ASSERT_NE(four, nullptr);
  int64_t tokens = 0;
  for (int turn = 0; turn < 20; ++turn) {
    SCOPED_TRACE(turn);
    Collected a = Run(*one, Turn("tp", kLines[turn % 6], 2 * turn));
    Collected b = Run(*two, Turn("tp", kLines[turn % 6], 2 * turn));
    Collected c = Run(*four, Turn("tp", kLines[turn % 6], 2 * turn));
    ASSERT_TRUE(a.status.ok() && b.status.ok() && c.status.ok())
        << a.status << b.status << c.status;
    EXPECT_EQ(a.token_ids, b.token_ids) << "tp 2";
    EXPECT_EQ(a.token_ids, c.token_ids) << "tp 4";
    tokens = a.summary.prompt_tokens + a.summary.generated_tokens;
  }
  EXPECT_GT(tokens, 2 * model_->config.max_seq_len) << "past the context, re-positioned";
}

}  // namespace
}  // namespace recall::serving
