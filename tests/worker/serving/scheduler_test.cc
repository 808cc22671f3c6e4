// Scheduler on stories260K (real weights): batched equals sequential for greedy, multi-turn
// reuse, residency errors, cancellation (waiting and non-blocking control calls), memory
// pressure (offload, drop, queue, preemption) and eviction policies per session. In-process;
// the gRPC surface is tested end to end in tests/integration.
#include "worker/serving/scheduler.h"

#include <cmath>
#include <functional>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/common/stories260k.h"
#include "worker/model/loader.h"
#include "worker/serving/turn_collect.h"

namespace recall::serving {
namespace {

class SchedulerTest : public recall::testing::Stories260KTest {
 protected:
  void SetUp() override {
    Stories260KTest::SetUp();
    if (model_ == nullptr) return;  // skipped or failed
    backend_ = kernels::CreateCpuBackend({2});
  }

  // A scheduler over a pool with room for `blocks` blocks of 16 tokens in every layer (the
  // pool's blocks hold one layer each: blocks * n_layers of them).
  void Start(int64_t blocks, SchedulerOptions o = {}) {
    StartPool(blocks * model_->config.n_layers, o);
  }
  // Over a pool of `pool_blocks` blocks (of one layer each).
  void StartPool(int64_t pool_blocks, SchedulerOptions o = {}) {
    const model::ModelConfig& c = model_->config;
    sched_.reset();
    auto pool = cache::BlockPool::Create({c.n_layers, c.n_kv_heads, c.head_dim, 16}, pool_blocks);
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = std::move(*pool);
    o.stop_token_ids = {2};
    auto s = Scheduler::Create(*model_, *backend_, *pool_, *tok_, o);
    ASSERT_TRUE(s.ok()) << s.status();
    sched_ = std::move(*s);
  }

  static TurnRequest Turn(const std::string& session, const std::string& text, int max_tokens,
                          int history_length = 0) {
    TurnRequest r;
    r.session_id = session;
    r.messages = {{"user", text}};
    r.history_length = history_length;
    r.sampling.temperature = 0;
    r.max_tokens = max_tokens;
    return r;
  }

  Collected Run(TurnRequest r) {
    auto stream = sched_->Submit(std::move(r));
    if (!stream.ok()) return Collected{.status = stream.status()};
    return CollectTurn(**stream);
  }

  // DropSessionAsync's answer (on the engine thread), waited for (30 s at most).
  absl::StatusOr<int64_t> DropAsync(const std::string& session, bool if_idle = false) {
    absl::Notification done;
    absl::StatusOr<int64_t> freed = absl::DeadlineExceededError("no answer in 30 s");
    sched_->DropSessionAsync(
        session,
        [&](absl::StatusOr<int64_t> f) {
          freed = f;
          done.Notify();
        },
        if_idle);
    done.WaitForNotificationWithTimeout(absl::Seconds(30));
    return freed;
  }

  // The load once `done` holds for it (it is published after each engine step), or the last
  // one seen after 10 s.
  LoadSnapshot WaitForLoad(const std::function<bool(const LoadSnapshot&)>& done) {
    LoadSnapshot load = sched_->Load();
    for (int i = 0; i < 1000 && !done(load); ++i) {
      absl::SleepFor(absl::Milliseconds(10));
      load = sched_->Load();
    }
    return load;
  }

  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<cache::BlockPool> pool_;
  std::unique_ptr<Scheduler> sched_;
};

const std::vector<std::string> kPrompts = {"Once upon a time",        "Lily had a red ball",
                                           "The dog ran to the park", "Tom was sad",
                                           "A little bird sang",      "The sun was hot"};

TEST_F(SchedulerTest, BatchedEqualsSequentialForGreedy) {
  Start(512);
  std::vector<Collected> alone;
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    alone.push_back(Run(Turn("alone" + std::to_string(i), kPrompts[i], 60)));
    ASSERT_TRUE(alone.back().status.ok()) << alone.back().status;
    ASSERT_GT(alone.back().token_ids.size(), 5u);
  }
  // All at once: they prefill and decode in the same batches.
  std::vector<std::shared_ptr<TurnStream>> streams;
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    auto s = sched_->Submit(Turn("batched" + std::to_string(i), kPrompts[i], 60));
    ASSERT_TRUE(s.ok()) << s.status();
    streams.push_back(*s);
  }
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    Collected b = CollectTurn(*streams[i]);
    ASSERT_TRUE(b.status.ok()) << b.status;
    EXPECT_EQ(b.token_ids, alone[i].token_ids) << kPrompts[i];
    EXPECT_EQ(b.text, alone[i].text);
    EXPECT_EQ(b.summary.text, b.text);
  }
}

// Sampled turns are picked where the logits are (Backend::SampleRows) unless they need the
// logits on the host (logprobs): both ways, a seed gives the same tokens, batched or alone.
TEST_F(SchedulerTest, SeededSamplingIsTheSamePickedWhereTheLogitsAreOrOnTheHost) {
  Start(512);
  const auto sampled = [](const std::string& session, uint64_t seed, bool logprobs) {
    TurnRequest r = Turn(session, "Lily had a red ball", 40);
    r.sampling.temperature = 0.9f;
    r.sampling.top_p = 0.95f;
    r.sampling.top_k = 30;
    r.sampling.seed = seed;
    r.logprobs = logprobs;
    return r;
  };
  const Collected host = Run(sampled("host", 7, true));
  ASSERT_TRUE(host.status.ok()) << host.status;
  ASSERT_EQ(host.logprobs.size(), host.token_ids.size()) << "the host path was taken";
  std::vector<std::shared_ptr<TurnStream>> streams;
  for (const auto& [name, seed] : {std::pair<std::string, uint64_t>{"picked", 7}, {"other", 8}}) {
    auto s = sched_->Submit(sampled(name, seed, false));
    ASSERT_TRUE(s.ok()) << s.status();
    streams.push_back(*s);
  }
  const Collected picked = CollectTurn(*streams[0]);
  const Collected other = CollectTurn(*streams[1]);
  ASSERT_TRUE(picked.status.ok()) << picked.status;
  EXPECT_TRUE(picked.logprobs.empty());
  EXPECT_EQ(picked.token_ids, host.token_ids);
  EXPECT_NE(other.token_ids, host.token_ids) << "another seed samples other tokens";
}

// Logprobs with alternatives: per token, the top_logprobs most likely tokens, most likely
// first, the sampled one first when greedy, each a log probability (<= 0, summing to <= 1);
// the tokens' bytes make up the reply's text.
TEST_F(SchedulerTest, TopLogprobsRankTheAlternativesAndSpellTheReply) {
  Start(512);
  TurnRequest r = Turn("lp", "Lily had a red ball", 16);
  r.sampling.temperature = 0;
  r.logprobs = true;
  r.top_logprobs = 5;
  const Collected c = Run(std::move(r));
  ASSERT_TRUE(c.status.ok()) << c.status;
  ASSERT_EQ(c.logprobs.size(), c.token_ids.size());
  ASSERT_FALSE(c.token_ids.empty());
  std::string spelled;
  for (size_t i = 0; i < c.logprobs.size(); ++i) {
    const TokenLogprob& lp = c.logprobs[i];
    SCOPED_TRACE(i);
    ASSERT_EQ(lp.top_ids.size(), 5u);
    ASSERT_EQ(lp.top_logprobs.size(), 5u);
    ASSERT_EQ(lp.top_tokens.size(), 5u);
    EXPECT_EQ(lp.top_ids[0], c.token_ids[i]) << "greedy picks the most likely";
    EXPECT_EQ(lp.top_logprobs[0], lp.logprob);
    EXPECT_EQ(lp.top_tokens[0], lp.token);
    double mass = 0;
    for (size_t k = 0; k < 5; ++k) {
      EXPECT_LE(lp.top_logprobs[k], 0.0f);
      if (k > 0) {
        EXPECT_LE(lp.top_logprobs[k], lp.top_logprobs[k - 1]);
      }
      mass += std::exp(static_cast<double>(lp.top_logprobs[k]));
    }
    EXPECT_LE(mass, 1.0 + 1e-5);
    spelled += lp.token;
  }
  EXPECT_EQ(spelled, c.text);
}

// The load's tokens per second are those of the last 10 s at the time of asking: after a
// turn, its tokens; on an idle worker, 0 within 11 s (it kept the last step's rate).
TEST_F(SchedulerTest, TokensPerSecondFallToZeroOnAnIdleWorker) {
  Start(512);
  Collected c = Run(Turn("s", "Once upon a time", 40));
  ASSERT_TRUE(c.status.ok()) << c.status;
  const int tokens = c.summary.prompt_tokens + c.summary.generated_tokens;
  const LoadSnapshot busy = WaitForLoad([](const LoadSnapshot& l) { return l.active_turns == 0; });
  EXPECT_GT(busy.tokens_per_second, 0);
  EXPECT_LE(busy.tokens_per_second, tokens / 10.0 + 1e-9) << "the turn's tokens over 10 s";
  absl::SleepFor(absl::Seconds(11.2));
  EXPECT_EQ(sched_->Load().tokens_per_second, 0) << "idle for 11 s";
}

TEST_F(SchedulerTest, FollowUpTurnPrefillsOnlyItsNewTokens) {
  Start(512);
  Collected first = Run(Turn("s", "Once upon a time", 20));
  ASSERT_TRUE(first.status.ok()) << first.status;
  EXPECT_EQ(first.summary.cached_tokens, 0);
  EXPECT_FALSE(first.summary.rebuilt);
  const int context_after_first =
      first.summary.prompt_tokens + first.summary.generated_tokens -
      (first.summary.finish == TurnFinish::kLength ? 1 : 0);  // the last token is not fed yet

  Collected second = Run(Turn("s", "Then what?", 20, /*history_length=*/2));
  ASSERT_TRUE(second.status.ok()) << second.status;
  EXPECT_FALSE(second.summary.rebuilt);
  EXPECT_EQ(second.summary.cached_tokens, context_after_first);
  // New: the last sampled token of turn 1 (not fed yet when it ended by length) and the
  // rendering of the new message with the next generation prompt.
  const int pending = first.summary.finish == TurnFinish::kLength ? 1 : 0;
  const int expected_new =
      pending + static_cast<int>(tok_->Encode("\nuser: Then what?\nassistant:", false).size());
  EXPECT_EQ(second.summary.prompt_tokens - second.summary.cached_tokens, expected_new);
  EXPECT_LT(expected_new, first.summary.prompt_tokens + first.summary.generated_tokens);
}

TEST_F(SchedulerTest, NonResidentSessionNeedsHistoryThenRebuilds) {
  Start(512);
  Collected missing = Run(Turn("ghost", "Hello", 5, /*history_length=*/2));
  EXPECT_EQ(missing.status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(missing.status.message().find("resend with history"), std::string::npos);
  EXPECT_TRUE(IsHistoryNeeded(missing.status)) << missing.status;

  TurnRequest r = Turn("ghost", "Hello", 5, 2);
  r.history = {{"user", "Once upon a time"}, {"assistant", " there was a cat."}};
  Collected rebuilt = Run(r);
  ASSERT_TRUE(rebuilt.status.ok()) << rebuilt.status;
  EXPECT_TRUE(rebuilt.summary.rebuilt);
  EXPECT_EQ(rebuilt.summary.cached_tokens, 0);
  // A session whose history is its system prompt only is at its first turn: not rebuilt.
  TurnRequest first = Turn("system-only", "Hello", 5, 1);
  first.history = {{"system", "Be brief."}};
  Collected fresh = Run(first);
  ASSERT_TRUE(fresh.status.ok()) << fresh.status;
  EXPECT_FALSE(fresh.summary.rebuilt);
}

TEST_F(SchedulerTest, AbortEndsTheTurnAndFreesItsBlocks) {
  Start(512);
  const int64_t free_before = pool_->free_blocks();
  TurnRequest r = Turn("long", "Once upon a time", 400);
  r.request_id = "req-1";
  auto stream = sched_->Submit(r);
  ASSERT_TRUE(stream.ok());
  TurnUpdate u;
  ASSERT_TRUE((*stream)->Next(absl::Seconds(30), &u));  // generation has started
  EXPECT_EQ(sched_->AbortRequest("req-1"), 1);
  Collected rest = CollectTurn(**stream);
  EXPECT_EQ(rest.status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(pool_->free_blocks(), free_before);
  // The partial turn is not part of the session: its cache is gone.
  EXPECT_EQ(sched_->DropSession("long").status().code(), absl::StatusCode::kNotFound);
}

TEST_F(SchedulerTest, TheNonBlockingControlCallsAnswerOnTheEngineThread) {
  // What the worker's gRPC reactions use: the abort and the drop return at once and report
  // their results through the callback; the stream ends with Cancelled, the blocks are free.
  Start(512);
  const int64_t free_before = pool_->free_blocks();
  TurnRequest r = Turn("async", "Once upon a time", 400);
  r.request_id = "req-async";
  auto stream = sched_->Submit(r);
  ASSERT_TRUE(stream.ok());
  TurnUpdate u;
  ASSERT_TRUE((*stream)->Next(absl::Seconds(30), &u));  // generation has started
  absl::Notification aborted;
  int count = -1;
  sched_->AbortRequestAsync("req-async", [&](int n) {
    count = n;
    aborted.Notify();
  });
  Collected rest = CollectTurn(**stream);
  EXPECT_EQ(rest.status.code(), absl::StatusCode::kCancelled);
  ASSERT_TRUE(aborted.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(count, 1);
  EXPECT_EQ(pool_->free_blocks(), free_before);

  ASSERT_TRUE(Run(Turn("kept", "Once upon a time", 8)).status.ok());
  absl::StatusOr<int64_t> freed = DropAsync("kept");
  ASSERT_TRUE(freed.ok()) << freed.status();
  EXPECT_GT(*freed, 0);
  EXPECT_EQ(pool_->free_blocks(), free_before);
  freed = DropAsync("kept");
  EXPECT_EQ(freed.status().code(), absl::StatusCode::kNotFound);
}

// A drop of a session whose turn runs ends the turn NOT_FOUND (not CANCELLED, which a
// coordinator fails over to another worker) and answers the bytes it freed; a drop "if idle"
// (a stale copy's) leaves a session with a turn running alone.
TEST_F(SchedulerTest, ADropEndsTheSessionsTurnNotFoundUnlessOnlyIfIdle) {
  Start(512);
  const int64_t free_before = pool_->free_blocks();
  auto stream = sched_->Submit(Turn("busy", "Once upon a time", 400));
  ASSERT_TRUE(stream.ok());
  TurnUpdate u;
  ASSERT_TRUE((*stream)->Next(absl::Seconds(30), &u));  // generation has started
  const absl::StatusOr<int64_t> kept = DropAsync("busy", /*if_idle=*/true);
  EXPECT_EQ(kept.status().code(), absl::StatusCode::kFailedPrecondition) << kept.status();
  const absl::StatusOr<int64_t> freed = DropAsync("busy", /*if_idle=*/false);
  ASSERT_TRUE(freed.ok()) << freed.status();
  EXPECT_GT(*freed, 0) << "what the session held as its turn ended";
  const Collected rest = CollectTurn(**stream);
  EXPECT_EQ(rest.status.code(), absl::StatusCode::kNotFound) << rest.status;
  EXPECT_NE(rest.status.message().find("session_id: session \"busy\" was dropped while its turn"),
            std::string::npos)
      << rest.status;
  EXPECT_EQ(pool_->free_blocks(), free_before);
  // Idle, a drop "if idle" drops it.
  ASSERT_TRUE(Run(Turn("idle", "Once upon a time", 8)).status.ok());
  const absl::StatusOr<int64_t> idle = DropAsync("idle", /*if_idle=*/true);
  ASSERT_TRUE(idle.ok()) << idle.status();
  EXPECT_GT(*idle, 0);
  EXPECT_EQ(pool_->free_blocks(), free_before);
}

TEST_F(SchedulerTest, SecondTurnWhileOneRunsIsRefused) {
  Start(512);
  auto first = sched_->Submit(Turn("busy", "Once upon a time", 200));
  ASSERT_TRUE(first.ok());
  auto second = sched_->Submit(Turn("busy", "again", 5, 2));
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  sched_->AbortSession("busy");
  CollectTurn(**first);
}

// A client that leaves and sends the session's next turn at once (a retry) finds the left
// turn still in the batch until the engine applies its abort: the next turn is taken instead
// of refused (it waits for that abort), and runs.
TEST_F(SchedulerTest, ANextTurnWaitsForTheAbortOfTheSessionsTurn) {
  Start(512);
  TurnRequest left = Turn("left", "Once upon a time", 200);
  left.request_id = "left-1";
  auto first = sched_->Submit(std::move(left));
  ASSERT_TRUE(first.ok());
  sched_->AbortRequestAsync("left-1");
  auto next = sched_->Submit(Turn("left", "Once upon a time", 5));
  ASSERT_TRUE(next.ok()) << next.status();
  const absl::StatusCode ended = CollectTurn(**first).status.code();
  EXPECT_TRUE(ended == absl::StatusCode::kCancelled || ended == absl::StatusCode::kOk) << ended;
  const Collected c = CollectTurn(**next);
  EXPECT_TRUE(c.status.ok()) << c.status;
}

// Holds the engine thread (in a command's answer, which runs there) until `release`: a
// command posted meanwhile is not applied yet. Released when it leaves scope at the latest.
class EngineHold {
 public:
  explicit EngineHold(Scheduler& s) : state_(std::make_shared<State>()) {
    s.AbortRequestAsync("engine-hold", [state = state_](int) {
      state->held.Notify();
      state->release.WaitForNotification();
    });
    EXPECT_TRUE(state_->held.WaitForNotificationWithTimeout(absl::Seconds(30)));
  }
  ~EngineHold() { Release(); }
  void Release() {
    if (!state_->release.HasBeenNotified()) state_->release.Notify();
  }

 private:
  struct State {
    absl::Notification held, release;
  };
  std::shared_ptr<State> state_;  // shared with the engine thread's callback
};

// The session's next turn comes while its left turn's abort is not applied yet (the engine
// is held): Submit returns at once (it runs on a gRPC callback thread; it used to wait for
// the abort, up to 10 s), the turn runs once the left one ended (counted queued meanwhile,
// in the worker's load), and a third turn of the session is refused meanwhile.
TEST_F(SchedulerTest, ANextTurnAfterAnAbortIsTakenWithoutWaiting) {
  Start(512);
  TurnRequest left = Turn("left", "Once upon a time", 400);
  left.request_id = "left-1";
  auto first = sched_->Submit(std::move(left));
  ASSERT_TRUE(first.ok());
  TurnUpdate u;
  ASSERT_TRUE((*first)->Next(absl::Seconds(30), &u));  // running
  EngineHold hold(*sched_);
  sched_->AbortRequestAsync("left-1");
  const absl::Time start = absl::Now();
  auto next = sched_->Submit(Turn("left", "Once upon a time", 5));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << "Submit waited for the engine";
  auto third = sched_->Submit(Turn("left", "Once upon a time", 5));
  EXPECT_EQ(third.status().code(), absl::StatusCode::kFailedPrecondition) << third.status();
  EXPECT_EQ(sched_->Load().queued_turns, 1) << "the parked turn is reported queued";
  hold.Release();
  EXPECT_EQ(CollectTurn(**first).status.code(), absl::StatusCode::kCancelled);
  const Collected c = CollectTurn(**next);
  EXPECT_TRUE(c.status.ok()) << c.status;
  EXPECT_EQ(c.summary.generated_tokens, 5);
}

// An abort of the session (or a drop, or the scheduler's end) also ends the turn that waits
// for its running turn's abort: both end Cancelled and count.
TEST_F(SchedulerTest, AnAbortOfTheSessionEndsTheTurnWaitingForIt) {
  Start(512);
  auto first = sched_->Submit(Turn("left", "Once upon a time", 400));
  ASSERT_TRUE(first.ok());
  TurnUpdate u;
  ASSERT_TRUE((*first)->Next(absl::Seconds(30), &u));
  EngineHold hold(*sched_);
  absl::Notification answered;
  int count = -1;
  sched_->AbortSessionAsync("left", [&](int n) {
    count = n;
    answered.Notify();
  });
  auto next = sched_->Submit(Turn("left", "Once upon a time", 5));
  ASSERT_TRUE(next.ok()) << next.status();
  hold.Release();
  EXPECT_EQ(CollectTurn(**first).status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(CollectTurn(**next).status.code(), absl::StatusCode::kCancelled);
  ASSERT_TRUE(answered.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(count, 2);
  // Free again: a turn runs.
  EXPECT_TRUE(Run(Turn("left", "Once upon a time", 5)).status.ok());

  // The scheduler ending right after such an abort: the waiting turn's stream ends too.
  auto busy = sched_->Submit(Turn("end", "Once upon a time", 400));
  ASSERT_TRUE(busy.ok());
  ASSERT_TRUE((*busy)->Next(absl::Seconds(30), &u));
  std::shared_ptr<TurnStream> waiting;
  {
    EngineHold hold2(*sched_);
    sched_->AbortSessionAsync("end");
    auto w = sched_->Submit(Turn("end", "Once upon a time", 5));
    ASSERT_TRUE(w.ok()) << w.status();
    waiting = *w;
  }
  sched_.reset();
  EXPECT_EQ(CollectTurn(*waiting).status.code(), absl::StatusCode::kCancelled);
}

// An abort of a turn submitted while the engine was in a step (still incoming, not yet
// waiting) finds it: it ends Cancelled instead of running to its end.
TEST_F(SchedulerTest, AnAbortFindsATurnStillIncoming) {
  Start(512);
  auto busy = sched_->Submit(Turn("busy", "Once upon a time", 400));
  ASSERT_TRUE(busy.ok());
  TurnUpdate u;
  ASSERT_TRUE((*busy)->Next(absl::Seconds(30), &u));  // the engine is stepping
  for (int round = 0; round < 5; ++round) {
    TurnRequest late = Turn("late" + std::to_string(round), "Lily had a red ball", 200);
    late.request_id = "late-" + std::to_string(round);
    auto stream = sched_->Submit(late);
    ASSERT_TRUE(stream.ok()) << stream.status();
    absl::Notification aborted;
    int count = -1;
    sched_->AbortRequestAsync(late.request_id, [&](int n) {
      count = n;
      aborted.Notify();
    });
    const Collected c = CollectTurn(**stream);
    EXPECT_EQ(c.status.code(), absl::StatusCode::kCancelled) << "round " << round;
    ASSERT_TRUE(aborted.WaitForNotificationWithTimeout(absl::Seconds(30)));
    EXPECT_EQ(count, 1) << "round " << round;
  }
  sched_->AbortSession("busy");
  CollectTurn(**busy);
}

// An abort by request id that comes before its turn (they travel on different calls) is
// remembered when asked to: the turn is refused (Cancelled) when it comes, once. Without
// remember_unseen (the worker's own ids), nothing is remembered.
TEST_F(SchedulerTest, AnAbortThatOvertookItsTurnRefusesItWhenItComes) {
  Start(512);
  absl::Notification answered;
  int count = -1;
  sched_->AbortRequestAsync(
      "early-1",
      [&](int n) {
        count = n;
        answered.Notify();
      },
      /*remember_unseen=*/true);
  ASSERT_TRUE(answered.WaitForNotificationWithTimeout(absl::Seconds(30)));
  EXPECT_EQ(count, 0);
  TurnRequest r = Turn("early", "Once upon a time", 5);
  r.request_id = "early-1";
  auto refused = sched_->Submit(r);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kCancelled) << refused.status();
  EXPECT_NE(refused.status().message().find("aborted before it arrived"), std::string::npos)
      << refused.status();
  // Once: the id is forgotten after it refused its turn.
  EXPECT_TRUE(Run(r).status.ok());
  EXPECT_EQ(sched_->AbortRequest("early-2"), 0);  // not remembered
  TurnRequest r2 = Turn("early3", "Once upon a time", 5);
  r2.request_id = "early-2";
  EXPECT_TRUE(Run(r2).status.ok());
}

// Resume tokens that take a new (or rebuilt) session past the context are refused by name
// before any step; before, the check needed a cache, and the turn reached the forward pass
// ("batch item 0: position 513 exceeds the model's context length"), whose error is the
// whole batch's. A turn running beside it goes on.
TEST_F(SchedulerTest, ResumeTokensPastTheContextAreRefusedAloneForANewSession) {
  Start(512);
  auto bystander = sched_->Submit(Turn("bystander", "Once upon a time", 400));
  ASSERT_TRUE(bystander.ok());
  TurnUpdate u;
  ASSERT_TRUE((*bystander)->Next(absl::Seconds(30), &u));  // it is running
  // Fewer resume tokens than max_tokens (else refused up front), the prompt's on top.
  TurnRequest r = Turn("too-long", "Lily had a red ball", model_->config.max_seq_len + 100);
  r.resume_tokens.assign(static_cast<size_t>(model_->config.max_seq_len) - 8, 300);
  const Collected refused = Run(r);
  EXPECT_EQ(refused.status.code(), absl::StatusCode::kInvalidArgument) << refused.status;
  EXPECT_NE(refused.status.message().find("resume_tokens"), std::string::npos) << refused.status;
  const Collected rest = CollectTurn(**bystander);
  EXPECT_TRUE(rest.status.ok()) << rest.status;
}

TEST_F(SchedulerTest, IdleSessionsAreOffloadedAndRestoredExactly) {
  // 12 blocks of 16 tokens: room for about two sessions of ~90 tokens at a time.
  Start(12);
  std::vector<Collected> firsts;
  for (int i = 0; i < 4; ++i) {
    firsts.push_back(Run(Turn("o" + std::to_string(i), kPrompts[i], 60)));
    ASSERT_TRUE(firsts.back().status.ok()) << firsts.back().status;
  }
  LoadSnapshot load = sched_->Load();
  EXPECT_GT(load.offloaded_sessions, 0);
  EXPECT_GT(load.host_bytes_used, 0);
  // Every session continues from its own (restored) cache.
  for (int i = 0; i < 4; ++i) {
    Collected c = Run(Turn("o" + std::to_string(i), "and then", 10, 2));
    ASSERT_TRUE(c.status.ok()) << c.status;
    EXPECT_FALSE(c.summary.rebuilt);
    EXPECT_GT(c.summary.cached_tokens, 0);
  }
}

TEST_F(SchedulerTest, WithoutHostRoomIdleSessionsAreDroppedAndRebuilt) {
  SchedulerOptions o;
  o.host_cache_bytes = 0;
  Start(12, o);
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(Run(Turn("d" + std::to_string(i), kPrompts[i], 60)).status.ok());
  }
  EXPECT_EQ(sched_->Load().offloaded_sessions, 0);
  // Session d0 was dropped to make room: its next turn needs the transcript.
  Collected c = Run(Turn("d0", "and then", 5, 2));
  EXPECT_EQ(c.status.code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(SchedulerTest, ConcurrentTurnsBeyondThePoolAllComplete) {
  // 10 blocks (160 token slots) for 6 sessions of ~70 tokens: turns wait or are preempted,
  // none fails, and greedy output is what each session produces alone.
  Start(10);
  std::vector<Collected> alone;
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    alone.push_back(Run(Turn("ref" + std::to_string(i), kPrompts[i], 50)));
    ASSERT_TRUE(alone.back().status.ok());
    sched_->DropSession("ref" + std::to_string(i)).IgnoreError();
  }
  std::vector<std::shared_ptr<TurnStream>> streams;
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    auto s = sched_->Submit(Turn("c" + std::to_string(i), kPrompts[i], 50));
    ASSERT_TRUE(s.ok()) << s.status();
    streams.push_back(*s);
  }
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    Collected c = CollectTurn(*streams[i]);
    ASSERT_TRUE(c.status.ok()) << c.status;
    EXPECT_EQ(c.token_ids, alone[i].token_ids);
  }
}

TEST_F(SchedulerTest, ConcurrentFollowUpsOfResidentSessionsOnATightPoolAllComplete) {
  // Four resident sessions fill most of 12 blocks; then all four send their next turn at
  // once. Their sessions are all busy (turns waiting), so room comes from offloading the
  // waiting ones, which their own admission restores: no turn fails, none is rebuilt.
  Start(12);
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(Run(Turn("f" + std::to_string(i), kPrompts[i], 40)).status.ok());
  }
  std::vector<std::shared_ptr<TurnStream>> streams;
  for (int i = 0; i < 4; ++i) {
    auto s = sched_->Submit(Turn("f" + std::to_string(i), "and then", 20, 2));
    ASSERT_TRUE(s.ok()) << s.status();
    streams.push_back(*s);
  }
  for (auto& stream : streams) {
    Collected c = CollectTurn(*stream);
    ASSERT_TRUE(c.status.ok()) << c.status;
    EXPECT_FALSE(c.summary.rebuilt);
    EXPECT_GT(c.summary.cached_tokens, 0);
  }
}

TEST_F(SchedulerTest, FullQueueIsResourceExhaustedWithRetryHint) {
  SchedulerOptions o;
  o.max_active = 1;
  o.max_queued = 1;
  Start(64, o);
  std::vector<std::shared_ptr<TurnStream>> accepted;
  absl::Status refused;
  for (int i = 0; i < 6 && refused.ok(); ++i) {
    auto s = sched_->Submit(Turn("q" + std::to_string(i), "Once upon a time", 100));
    if (s.ok()) {
      accepted.push_back(*s);
    } else {
      refused = s.status();
    }
  }
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.message().find("retry after"), std::string::npos);
  EXPECT_NE(refused.message().find("(retryable)"), std::string::npos) << refused;
  // One running and one waiting (max_active more were let wait).
  EXPECT_EQ(accepted.size(), 2u) << refused;
  EXPECT_NE(refused.message().find(" turns running and "), std::string::npos) << refused;
  for (auto& s : accepted) EXPECT_TRUE(CollectTurn(*s).status.ok());
}

// --max-queued 0: a turn is taken only while the batch has a slot for it.
TEST_F(SchedulerTest, NoQueueTakesOnlyWhatTheBatchHasSlotsFor) {
  SchedulerOptions o;
  o.max_active = 3;
  o.max_queued = 0;
  Start(64, o);
  std::vector<std::shared_ptr<TurnStream>> accepted;
  absl::Status refused;
  for (int i = 0; i < 8 && refused.ok(); ++i) {
    auto s = sched_->Submit(Turn("q" + std::to_string(i), "Once upon a time", 200));
    if (s.ok()) {
      accepted.push_back(*s);
    } else {
      refused = s.status();
    }
  }
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_EQ(accepted.size(), 3u) << refused;
  // Once they run, the batch has no slot: refused still (running turns were not counted, so
  // as many again were taken to wait).
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (sched_->Load().active_turns < 3 && absl::Now() < deadline)
    absl::SleepFor(absl::Milliseconds(1));
  ASSERT_EQ(sched_->Load().active_turns, 3);
  auto more = sched_->Submit(Turn("more", "Once upon a time", 10));
  EXPECT_EQ(more.status().code(), absl::StatusCode::kResourceExhausted) << more.status();
  EXPECT_NE(more.status().message().find("3 turns running and 0 waiting (queue limit 0)"),
            std::string::npos)
      << more.status();
  for (auto& s : accepted) EXPECT_TRUE(CollectTurn(*s).status.ok());
}

TEST_F(SchedulerTest, TurnThatCanNeverFitIsResourceExhausted) {
  Start(2);  // 32 token slots
  TurnRequest r = Turn("big", std::string(300, 'a'), 5);
  Collected c = Run(r);
  EXPECT_EQ(c.status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(pool_->free_blocks(), 2 * model_->config.n_layers);
}

TEST_F(SchedulerTest, TurnWhoseFullCacheCanNeverFitIsRefusedBeforeAnyToken) {
  Start(8);  // 128 token slots per layer
  Collected c = Run(Turn("greedy", "Once upon a time", 300));
  EXPECT_EQ(c.status.code(), absl::StatusCode::kResourceExhausted) << c.status;
  EXPECT_TRUE(c.token_ids.empty()) << "refused before any token streams";
  EXPECT_NE(c.status.message().find("sampling.max_tokens"), std::string::npos) << c.status;
  EXPECT_NE(c.status.message().find("not retryable"), std::string::npos) << c.status;
  EXPECT_EQ(pool_->free_blocks(), pool_->num_blocks());
  // The same turn within the pool, and an evicting session whose cache stays bounded.
  EXPECT_TRUE(Run(Turn("small", "Once upon a time", 100)).status.ok());
  TurnRequest lazy = Turn("lazy", "Once upon a time", 300);
  lazy.cache.policy = "lazy";
  lazy.cache.budget_tokens = 48;
  lazy.cache.window = 16;
  Collected l = Run(lazy);
  ASSERT_TRUE(l.status.ok()) << l.status;
  EXPECT_GT(l.token_ids.size(), 100u);
}

// A lazy session whose budget and window (65 tokens: 5 blocks in each of 5 layers) plus the
// policy's state and the turn's scratch outgrow a pool of 15-25 blocks once decoding: the
// turn ends RESOURCE_EXHAUSTED, not retryable (nothing else holds the pool: the same turn
// would fail again; it asked clients to retry after 1 s), naming what to change. One block
// more per layer holds it.
TEST_F(SchedulerTest, AnEvictingTurnThatOutgrowsThePoolIsNotRetryable) {
  auto lazy = [] {
    TurnRequest r = Turn("lazy", "Once upon a time", 300);
    r.cache.policy = "lazy";
    r.cache.budget_tokens = 48;
    r.cache.window = 16;
    return r;
  };
  for (const int blocks : {3, 5}) {
    Start(blocks);
    Collected c = Run(lazy());
    EXPECT_EQ(c.status.code(), absl::StatusCode::kResourceExhausted) << c.status;
    EXPECT_NE(c.status.message().find("not retryable"), std::string::npos) << c.status;
    EXPECT_EQ(c.status.message().find("retry after"), std::string::npos) << c.status;
    EXPECT_NE(c.status.message().find("cache.budget_tokens"), std::string::npos) << c.status;
  }
  Start(6);
  Collected fits = Run(lazy());
  ASSERT_TRUE(fits.status.ok()) << fits.status;
  EXPECT_EQ(fits.token_ids.size(), 300u);
}

TEST_F(SchedulerTest, TurnLongerThanTheContextIsInvalidArgument) {
  Start(64);
  std::string text;
  for (int i = 0; i < 200; ++i) text += "the cat sat. ";
  Collected c = Run(Turn("long", text, 5));
  EXPECT_EQ(c.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c.status.message().find("context length"), std::string::npos) << c.status;
}

TEST_F(SchedulerTest, LazyEvictionKeepsTheSessionWithinItsBudget) {
  Start(512);
  TurnRequest full = Turn("full", "Once upon a time", 300);
  TurnRequest lazy = Turn("lazy", "Once upon a time", 300);
  lazy.cache.policy = "lazy";
  lazy.cache.budget_tokens = 64;
  lazy.cache.window = 16;
  Collected f = Run(full);
  Collected l = Run(lazy);
  ASSERT_TRUE(f.status.ok() && l.status.ok()) << f.status << l.status;
  EXPECT_EQ(f.summary.evictions, 0);
  EXPECT_GT(l.summary.evictions, 0);
  if (l.summary.generated_tokens > 100) {
    EXPECT_LT(l.summary.kv_bytes, f.summary.kv_bytes);
    EXPECT_LE(l.summary.kv_bytes,
              (64 + 16 + 16) / 16 * model_->config.n_layers * pool_->block_bytes());
  }
}

// The policies' state and the turns' scratch (attention probabilities) are counted against the
// pool: blocks are lent to cover them. A pool with room for two lazy sessions' KV blocks but
// not also for their state and a turn's scratch offloads the idle session instead of holding
// more than its bytes.
TEST_F(SchedulerTest, PolicyStateAndTurnScratchAreCountedAgainstThePool) {
  auto lazy = [](const std::string& id) {
    TurnRequest r = Turn(id, "Once upon a time", 120);
    r.cache.policy = "lazy";
    r.cache.budget_tokens = 64;
    r.cache.window = 16;
    return r;
  };
  Start(512);
  const int64_t bb = pool_->block_bytes();
  Collected a = Run(lazy("a"));
  ASSERT_TRUE(a.status.ok()) << a.status;
  ASSERT_GT(a.summary.state_bytes, 0);
  ASSERT_GT(a.summary.evictions, 0);
  const int64_t kv_blocks = (a.summary.kv_bytes - a.summary.state_bytes) / bb;
  // The turn's scratch is given back; the idle session's state keeps its blocks.
  LoadSnapshot load = WaitForLoad([&](const LoadSnapshot& l) {
    return l.active_turns == 0 && l.side_bytes == a.summary.state_bytes;
  });
  EXPECT_EQ(load.side_bytes, a.summary.state_bytes);
  EXPECT_EQ(load.side_blocks, (a.summary.state_bytes + bb - 1) / bb);
  EXPECT_EQ(pool_->free_blocks(), pool_->num_blocks() - kv_blocks - load.side_blocks);
  EXPECT_EQ(load.kv_blocks_free, pool_->free_blocks());

  // Room for session a's blocks and state and for b's KV at its peak (peak_kv_bytes counts
  // the state too, so this is at least b's peak KV blocks), not for b's state and scratch.
  const int64_t side_a = load.side_blocks;
  StartPool(kv_blocks + side_a + a.summary.peak_kv_bytes / bb);
  Collected a2 = Run(lazy("a"));
  Collected b2 = Run(lazy("b"));
  ASSERT_TRUE(a2.status.ok() && b2.status.ok()) << a2.status << b2.status;
  EXPECT_EQ(a2.token_ids, a.token_ids);
  EXPECT_EQ(b2.token_ids, a.token_ids);
  load = WaitForLoad([](const LoadSnapshot& l) { return l.active_turns == 0; });
  EXPECT_EQ(load.offloaded_sessions, 1);              // a, to make room for b's state and scratch
  EXPECT_EQ(load.side_bytes, a.summary.state_bytes);  // b's only
  EXPECT_GE(load.side_blocks * bb, load.side_bytes);
  // Session a continues from its restored cache and state.
  Collected a3 = Run(Turn("a", "and then", 10, 2));
  ASSERT_TRUE(a3.status.ok()) << a3.status;
  EXPECT_FALSE(a3.summary.rebuilt);
}

TEST_F(SchedulerTest, ResumedTurnContinuesWithoutRepeatingDeliveredTokens) {
  Start(512);
  Collected whole = Run(Turn("orig", "Once upon a time", 40));
  ASSERT_TRUE(whole.status.ok());
  ASSERT_GT(whole.token_ids.size(), 20u);
  // Another worker (here: a fresh session) resumes after the first 12 delivered tokens.
  TurnRequest r = Turn("failover", "Once upon a time", 40);
  r.resume_tokens.assign(whole.token_ids.begin(), whole.token_ids.begin() + 12);
  Collected rest = Run(r);
  ASSERT_TRUE(rest.status.ok()) << rest.status;
  const std::vector<int32_t> expected(whole.token_ids.begin() + 12, whole.token_ids.end());
  EXPECT_EQ(rest.token_ids, expected) << "the rest of the reply, nothing repeated";
  EXPECT_EQ(rest.summary.generated_tokens, static_cast<int>(whole.token_ids.size()));
  // The text streamed by the resumed turn continues exactly where the delivered text ended.
  EXPECT_EQ(rest.summary.text, whole.summary.text);
  EXPECT_EQ(whole.text.substr(whole.text.size() - rest.text.size()), rest.text);

  // Sampled (temperature 1, a seed): the resumed turn takes the draws the uninterrupted one
  // took after its first 12 tokens, so it goes on with the same tokens.
  TurnRequest sampled = Turn("sampled", "Once upon a time", 40);
  sampled.sampling.temperature = 1.0f;
  sampled.sampling.seed = 7;
  const Collected drawn = Run(sampled);
  ASSERT_TRUE(drawn.status.ok());
  ASSERT_GT(drawn.token_ids.size(), 20u);
  TurnRequest again = sampled;
  again.session_id = "sampled-failover";
  again.resume_tokens.assign(drawn.token_ids.begin(), drawn.token_ids.begin() + 12);
  const Collected drawn_rest = Run(again);
  ASSERT_TRUE(drawn_rest.status.ok()) << drawn_rest.status;
  EXPECT_EQ(drawn_rest.token_ids,
            std::vector<int32_t>(drawn.token_ids.begin() + 12, drawn.token_ids.end()));
  EXPECT_EQ(drawn_rest.summary.text, drawn.summary.text);

  TurnRequest bad = Turn("bad", "x", 5);
  bad.resume_tokens = {1, 2, 3, 4, 5};
  EXPECT_EQ(Run(bad).status.code(), absl::StatusCode::kInvalidArgument);
  bad.resume_tokens = {100000};
  EXPECT_NE(std::string(Run(bad).status.message()).find("resume_tokens[0]"), std::string::npos);
}

// A reply that ended at the context (its last token sampled at the context's end, never fed)
// resumed whole, as a failover does when the worker died as it ended: it ends there again, the
// same reply; resumed short of its end it goes on to it. Whole, it was refused ("resume_tokens:
// do not fit the context", not retryable: a tester's turns near the context's end never
// completed after their worker died).
TEST_F(SchedulerTest, AReplyThatEndedAtTheContextResumesToItsEnd) {
  Start(512);
  const Collected whole = Run(Turn("ended", "Once upon a time", 600));
  ASSERT_TRUE(whole.status.ok()) << whole.status;
  ASSERT_EQ(whole.summary.finish, TurnFinish::kContext) << "the reply must reach the context";
  for (const size_t have : {whole.token_ids.size(), whole.token_ids.size() - 5}) {
    TurnRequest r = Turn("resumed-" + std::to_string(have), "Once upon a time", 600);
    r.resume_tokens.assign(whole.token_ids.begin(),
                           whole.token_ids.begin() + static_cast<std::ptrdiff_t>(have));
    const Collected rest = Run(r);
    ASSERT_TRUE(rest.status.ok()) << have << ": " << rest.status;
    EXPECT_EQ(rest.summary.finish, TurnFinish::kContext) << have;
    EXPECT_EQ(rest.summary.text, whole.summary.text) << have;
    EXPECT_EQ(rest.token_ids,
              std::vector<int32_t>(whole.token_ids.begin() + static_cast<std::ptrdiff_t>(have),
                                   whole.token_ids.end()))
        << have;
  }
  // One more token than the context could have given is refused, by name.
  TurnRequest over = Turn("over", "Once upon a time", 600);
  over.resume_tokens = whole.token_ids;
  over.resume_tokens.push_back(whole.token_ids.back());
  const Collected refused = Run(over);
  EXPECT_EQ(refused.status.code(), absl::StatusCode::kInvalidArgument) << refused.status;
  EXPECT_NE(refused.status.message().find("do not fit the context length 512"), std::string::npos)
      << refused.status;
}

TEST_F(SchedulerTest, BadRequestsNameTheField) {
  Start(64);
  TurnRequest r = Turn("x", "hi", 5);
  r.sampling.top_p = 1.5f;
  EXPECT_EQ(sched_->Submit(r).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(sched_->Submit(r).status().message()).find("sampling.top_p"),
            std::string::npos);
  r = Turn("x", "hi", 0);
  EXPECT_NE(std::string(sched_->Submit(r).status().message()).find("sampling.max_tokens"),
            std::string::npos);
  r = Turn("x", "hi", 5);
  r.cache.policy = "nope";
  EXPECT_NE(std::string(sched_->Submit(r).status().message()).find("cache.policy"),
            std::string::npos);
  r = Turn("x", "\xff\xfe", 5);
  EXPECT_NE(std::string(sched_->Submit(r).status().message()).find("messages[0].content"),
            std::string::npos);
  r = Turn("", "hi", 5);
  EXPECT_NE(std::string(sched_->Submit(r).status().message()).find("session_id"),
            std::string::npos);
}

}  // namespace
}  // namespace recall::serving
