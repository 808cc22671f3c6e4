// A reply cut at a stop string gives back the tokens fed after the cut and the session goes
// on from its cache (Scheduler::CutAtStop), where it used to be rebuilt from the whole
// transcript: the cache then holds what a session whose reply stopped there holds (the same
// next reply, greedy, without eviction); a cut inside a token keeps that token's text before
// the cut for the next turn; a compact lazy session cut at every turn goes on past the
// context without one rebuild, in its bound; a resumed reply that had reached its stop string
// ends there; TP ranks give the one-rank tokens. An aborted turn gives back all it fed.
#include <algorithm>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "cache/block_pool.h"
#include "cache/sequence_cache.h"
#include "gtest/gtest.h"
#include "tests/common/compact_lazy.h"
#include "tests/common/stories260k.h"
#include "worker/runtime/engine.h"
#include "worker/serving/replay.h"
#include "worker/serving/scheduler.h"
#include "worker/serving/session.h"
#include "worker/serving/turn_collect.h"
#include "worker/serving/turn_request.h"

namespace recall::serving {
namespace {

class StopCutTest : public recall::testing::Stories260KTest {
 protected:
  runtime::Engine* NewEngine(int tp = 1) { return testing::AddEngine(*model_, engines_, tp); }
  // A scheduler whose sessions keep every token (no eviction).
  std::unique_ptr<Scheduler> StartFull(std::vector<int32_t> stop_tokens = {2}) {
    runtime::Engine* e = NewEngine();
    if (e == nullptr) return nullptr;
    SchedulerOptions so;
    so.stop_token_ids = std::move(stop_tokens);
    auto s = Scheduler::Create(*e, *tok_, so, &metrics_);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *std::move(s) : nullptr;
  }
  std::unique_ptr<Scheduler> StartCompact(
      int tp = 1, const SchedulerOptions& so = testing::CompactLazyOptions()) {
    runtime::Engine* e = NewEngine(tp);
    return e == nullptr ? nullptr : testing::StartCompactLazy(*e, *tok_, &metrics_, so);
  }

  static TurnRequest Turn(const std::string& session, const std::string& text, int history,
                          std::vector<std::string> stop = {}, int max_tokens = 40) {
    TurnRequest r;
    r.session_id = session;
    r.messages = {{"user", text}};
    r.history_length = history;
    r.sampling.temperature = 0;
    r.max_tokens = max_tokens;
    r.stop = std::move(stop);
    return r;
  }
  static Collected Run(Scheduler& s, TurnRequest r) {
    auto stream = s.Submit(std::move(r));
    if (!stream.ok()) return Collected{.status = stream.status()};
    return CollectTurn(**stream);
  }
  // A reply the client wrote, kept from a stopped reply.
  static model::ChatMessage Part() { return {"assistant", " Once there"}; }
  // After a first turn, the second line, Part() and the third line in one turn.
  static TurnRequest ThreeAtOnce(const std::string& session) {
    const auto& lines = testing::kConversationLines;
    TurnRequest r = Turn(session, lines[2], 2);
    r.messages = {{"user", lines[1]}, Part(), {"user", lines[2]}};
    return r;
  }
  // The reference of the stopped sessions' caught-up turns: `session` given the first line
  // (8 tokens), then ThreeAtOnce; that turn's reply (or the first error).
  static Collected RunThreeAtOnce(Scheduler& s, const std::string& session) {
    const Collected first = Run(s, Turn(session, testing::kConversationLines[0], 0, {}, 8));
    if (!first.status.ok()) return first;
    return Run(s, ThreeAtOnce(session));
  }
  // Runs `r` (with a request id) until its first token, then aborts it (its client left):
  // how it ended.
  static Collected StopAfterFirstToken(Scheduler& s, const TurnRequest& r) {
    auto stream = s.Submit(r);
    if (!stream.ok()) return Collected{.status = stream.status()};
    TurnUpdate u;
    EXPECT_TRUE((*stream)->Next(absl::Seconds(30), &u));  // replying
    EXPECT_EQ(s.AbortRequest(r.request_id), 1);
    return CollectTurn(**stream);
  }

  // The text of each token of a reply (the first one's after the prompt left out: empty).
  std::vector<std::string> Pieces(const std::vector<int32_t>& ids) const {
    std::vector<std::string> pieces(ids.size());
    for (size_t i = 1; i < ids.size(); ++i) pieces[i] = tok_->TokenBytes(ids[i - 1], ids[i]);
    return pieces;
  }
  // Bytes of the reply's text before token j: the text less what tokens j.. decoded to.
  static size_t TextBefore(const Collected& c, const std::vector<std::string>& pieces, size_t j) {
    size_t after = 0;
    for (size_t i = j; i < pieces.size(); ++i) after += pieces[i].size();
    return c.text.size() - after;
  }

  bool Cut(const Collected& c) const {
    return testing::CutAtStopString(*tok_, c.token_ids, c.summary.text);
  }

  double Rebuilds() { return metrics_.GetCounter("recall_worker_rebuilds_total", "")->value(); }

  metrics::Registry metrics_;
  std::vector<std::unique_ptr<runtime::Engine>> engines_;
};

const auto& kLines = testing::kConversationLines;

// Two tensor-parallel ranks (one KV head each) re-positioned while the reply's last tokens were
// fed, each rank having evicted a different token: giving back the last two leaves them with
// one next position, the larger (the ranks feed the next token at the same position).
TEST(SessionUnfeedTest, TensorParallelRanksKeepOneNextPosition) {
  auto pool = cache::BlockPool::Create({1, 1, 4, 4}, 16);
  ASSERT_TRUE(pool.ok()) << pool.status();
  Session s;
  for (int r = 0; r < 2; ++r)
    s.caches.push_back(std::make_unique<cache::SequenceCache>(pool->get()));
  std::vector<int32_t> pos(8);
  std::iota(pos.begin(), pos.end(), 0);
  for (const auto& c : s.caches) {
    ASSERT_TRUE(c->Reserve(8).ok());
    c->CommitAppend(pos.data(), 8);
  }
  s.tokens.assign(8, 1);
  s.tokens_fed = 8;
  // Rank 0 evicted token 6, rank 1 token 2; both re-positioned to end before 8 (the longest).
  s.caches[0]->Compact(0, 0, {0, 1, 2, 3, 4, 5, 7});
  s.caches[1]->Compact(0, 0, {0, 1, 3, 4, 5, 6, 7});
  for (const auto& c : s.caches) {
    std::vector<int32_t> to = {1, 2, 3, 4, 5, 6, 7};
    c->MovePositions(to.data(), 7, 8);
  }
  s.Unfeed(2);  // tokens 6 and 7
  EXPECT_EQ(s.caches[0]->length(0, 0), 6);
  EXPECT_EQ(s.caches[1]->length(0, 0), 5);
  EXPECT_EQ(s.caches[0]->next_position(), 7) << "past rank 0's newest kept, at 6";
  EXPECT_EQ(s.caches[1]->next_position(), 7);
  EXPECT_EQ(s.caches[0]->sequence_length(), 6);
  EXPECT_EQ(s.caches[1]->sequence_length(), 6);
  EXPECT_EQ(s.tokens.size(), 6u);
}

// Cut where token j starts, by a stop string of tokens j and j + 1 (so token j was fed, and is
// given back): the cache then holds what a session whose reply was ended by token j as a stop
// token holds, and the next reply is the same.
TEST_F(StopCutTest, ACutAtATokenBoundaryLeavesWhatASessionStoppedThereHolds) {
  if (model_ == nullptr) return;
  std::unique_ptr<Scheduler> a = StartFull();
  ASSERT_NE(a, nullptr);
  const Collected probe = Run(*a, Turn("probe", kLines[0], 0));
  ASSERT_TRUE(probe.status.ok()) << probe.status;
  ASSERT_GE(probe.token_ids.size(), 30u) << probe.text;
  const std::vector<int32_t>& ids = probe.token_ids;
  const std::vector<std::string> pieces = Pieces(ids);
  size_t j = 0, before = 0;
  std::string stop;
  for (size_t k = 8; k + 2 < ids.size() && stop.empty(); ++k) {
    if (std::find(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(k), ids[k]) !=
            ids.begin() + static_cast<std::ptrdiff_t>(k) ||
        pieces[k].empty()) {
      continue;  // the stop token would end the reference earlier
    }
    const std::string s = pieces[k] + pieces[k + 1];
    if (probe.text.find(s) != TextBefore(probe, pieces, k)) continue;
    j = k;
    before = TextBefore(probe, pieces, k);
    stop = s;
  }
  ASSERT_FALSE(stop.empty()) << "no token of the reply starts a stop string first: " << probe.text;

  const Collected cut = Run(*a, Turn("cut", kLines[0], 0, {stop}));
  ASSERT_TRUE(cut.status.ok()) << cut.status;
  EXPECT_EQ(cut.summary.finish, TurnFinish::kStop);
  EXPECT_EQ(cut.summary.text, probe.text.substr(0, before));
  EXPECT_EQ(cut.summary.generated_tokens, static_cast<int>(j) + 2);
  EXPECT_EQ(cut.summary.held_tokens, cut.summary.prompt_tokens + static_cast<int64_t>(j))
      << "token j is given back; j + 1 was never fed";
  const Collected next = Run(*a, Turn("cut", kLines[1], 2));  // no history: from the cache
  ASSERT_TRUE(next.status.ok()) << next.status;
  EXPECT_FALSE(next.summary.rebuilt);
  EXPECT_EQ(next.summary.cached_tokens, cut.summary.prompt_tokens + static_cast<int>(j));

  std::unique_ptr<Scheduler> b = StartFull({2, ids[j]});
  ASSERT_NE(b, nullptr);
  const Collected ref = Run(*b, Turn("ref", kLines[0], 0));
  ASSERT_TRUE(ref.status.ok()) << ref.status;
  ASSERT_EQ(ref.summary.text, cut.summary.text);
  const Collected ref_next = Run(*b, Turn("ref", kLines[1], 2));
  ASSERT_TRUE(ref_next.status.ok()) << ref_next.status;
  EXPECT_EQ(next.token_ids, ref_next.token_ids);
  EXPECT_EQ(next.summary.prompt_tokens, ref_next.summary.prompt_tokens);
  EXPECT_EQ(next.summary.cached_tokens, ref_next.summary.cached_tokens);
  EXPECT_EQ(Rebuilds(), 0);
}

// recall_worker_turns_total counts a turn ended by its own fault (a prompt past the context)
// as outcome "refused", not "error" (the worker's failures), and a turn that ran as "length".
TEST_F(StopCutTest, ATurnRefusedForItsPromptIsCountedRefusedNotError) {
  std::unique_ptr<Scheduler> s = StartFull();
  ASSERT_NE(s, nullptr);
  std::string text;
  for (int i = 0; i < 200; ++i) text += "the cat sat. ";
  Collected c = Run(*s, Turn("long", text, 0));
  ASSERT_EQ(c.status.code(), absl::StatusCode::kInvalidArgument) << c.status;
  const auto outcome = [&](const std::string& o) {
    return metrics_.GetCounter("recall_worker_turns_total", "", "outcome=\"" + o + "\"")->value();
  };
  EXPECT_EQ(outcome("refused"), 1);
  EXPECT_EQ(outcome("error"), 0);
  ASSERT_TRUE(Run(*s, Turn("short", "Once upon a time", 0, {}, 5)).status.ok());
  EXPECT_EQ(outcome("length"), 1);
  EXPECT_EQ(outcome("refused"), 1);
}

// An aborted turn (its client left) gives back every token it fed, in its prefill or its
// reply: the next turn continues the cache (no rebuild, the same cached tokens) and replies
// as a session that never had the aborted turn does. The first turn ends by length, so its
// last token is still to be fed (pending): the aborted turn fed it, and gives it back too.
TEST_F(StopCutTest, AnAbortedTurnGivesBackWhatItFed) {
  auto sched = StartFull();
  ASSERT_NE(sched, nullptr);
  ASSERT_TRUE(Run(*sched, Turn("ref", kLines[0], 0, {}, 8)).status.ok());
  const Collected ref = Run(*sched, Turn("ref", kLines[2], 2));
  ASSERT_TRUE(ref.status.ok()) << ref.status;

  const Collected one = Run(*sched, Turn("s", kLines[0], 0, {}, 8));
  ASSERT_TRUE(one.status.ok()) << one.status;
  ASSERT_EQ(one.summary.finish, TurnFinish::kLength);
  TurnRequest two = Turn("s", kLines[1], 2, {}, 400);
  two.request_id = "two";
  EXPECT_EQ(StopAfterFirstToken(*sched, two).status.code(), absl::StatusCode::kCancelled);

  EXPECT_EQ(metrics_.GetCounter("recall_worker_taken_back_turns_total", "")->value(), 1);
  const double rebuilds = Rebuilds();
  const Collected three = Run(*sched, Turn("s", kLines[2], 2));
  ASSERT_TRUE(three.status.ok()) << three.status;
  EXPECT_EQ(Rebuilds(), rebuilds) << "continued from its cache";
  EXPECT_FALSE(three.summary.rebuilt);
  EXPECT_EQ(three.summary.cached_tokens, ref.summary.cached_tokens);
  EXPECT_EQ(three.summary.prompt_tokens, ref.summary.prompt_tokens);
  EXPECT_EQ(three.token_ids, ref.token_ids);
}

// The records of aborted turns kept for their Aborts' answers are bounded in tokens: past the
// bound the oldest goes, and its session, whose record no one can collect now, rebuilds at its
// next turn; the newest is kept and its session continues.
TEST_F(StopCutTest, RecordsOfAbortedTurnsAreBoundedInTokensTheOldestGoing) {
  SchedulerOptions so = testing::CompactLazyOptions();
  so.taken_back_tokens = 1;  // one record at most
  auto sched = StartCompact(1, so);
  ASSERT_NE(sched, nullptr);
  for (const std::string s : {"a", "b"}) {
    ASSERT_TRUE(Run(*sched, Turn(s, kLines[0], 0, {}, 8)).status.ok());
    TurnRequest two = Turn(s, kLines[1], 2, {}, 6);
    two.request_id = s + "-two";
    ASSERT_TRUE(Run(*sched, two).status.ok());
    EXPECT_EQ(sched->AbortRequest(two.request_id), 1) << s << ": ended, and taken back";
  }
  EXPECT_FALSE(sched->TakeTakenBack("a-two").has_value()) << "the oldest went";
  const std::optional<TakenBackTurn> b = sched->TakeTakenBack("b-two");
  ASSERT_TRUE(b.has_value()) << "the newest is kept";
  EXPECT_GT(b->token_ids.size(), 1u) << "kept though over the bound";
  const double rebuilds = Rebuilds();
  const Collected b3 = Run(*sched, Turn("b", kLines[2], 2));
  ASSERT_TRUE(b3.status.ok()) << b3.status;
  EXPECT_EQ(Rebuilds(), rebuilds) << "b's record was collected: it continues";
  const Collected a3 = Run(*sched, Turn("a", kLines[2], 2));
  EXPECT_TRUE(IsHistoryNeeded(a3.status))
      << "a's record went uncollected: it is rebuilt from its transcript, " << a3.status;
}

// The Abort of a turn that had already ended (its client left as the reply ran out: the
// coordinator stores it interrupted) takes it back as one before its end would have: the next
// turn continues the cache and replies as a session that never had that turn. In a session
// that evicts, the Abort's answer says what it fed. Not once the session went on, nor twice.
TEST_F(StopCutTest, AnAbortAfterItsTurnEndedTakesItBackStill) {
  for (const bool evicting : {false, true}) {
    SCOPED_TRACE(evicting ? "lazy" : "full");
    auto sched = evicting ? StartCompact() : StartFull();
    ASSERT_NE(sched, nullptr);
    ASSERT_TRUE(Run(*sched, Turn("ref", kLines[0], 0, {}, 8)).status.ok());
    const Collected ref = Run(*sched, Turn("ref", kLines[2], 2));
    ASSERT_TRUE(ref.status.ok()) << ref.status;

    ASSERT_TRUE(Run(*sched, Turn("s", kLines[0], 0, {}, 8)).status.ok());
    TurnRequest two = Turn("s", kLines[1], 2, {}, 6);
    two.request_id = "two";
    const Collected ended = Run(*sched, two);
    ASSERT_TRUE(ended.status.ok()) << ended.status;
    const double taken_before =
        metrics_.GetCounter("recall_worker_taken_back_turns_total", "")->value();
    EXPECT_EQ(sched->AbortRequest("two"), 1) << "ended, and taken back";
    EXPECT_EQ(metrics_.GetCounter("recall_worker_taken_back_turns_total", "")->value(),
              taken_before + 1);
    const std::optional<TakenBackTurn> taken_back = sched->TakeTakenBack("two");
    ASSERT_EQ(taken_back.has_value(), evicting);
    if (evicting) {
      const TakenBackTurn* taken = &*taken_back;
      const int fed = ended.summary.prompt_tokens - ended.summary.cached_tokens;
      EXPECT_EQ(taken->token_ids.size(), static_cast<size_t>(fed) + 5)
          << "its prompt's new tokens and five of its six reply tokens (the last was never fed)";
      EXPECT_EQ(taken->prompt_tokens, fed);
    }
    EXPECT_EQ(sched->AbortRequest("two"), 0) << "once";

    const double rebuilds = Rebuilds();
    const Collected three = Run(*sched, Turn("s", kLines[2], 2));
    ASSERT_TRUE(three.status.ok()) << three.status;
    EXPECT_EQ(Rebuilds(), rebuilds) << "continued from its cache";
    EXPECT_EQ(three.summary.cached_tokens, ref.summary.cached_tokens);
    EXPECT_EQ(three.summary.prompt_tokens, ref.summary.prompt_tokens);
    if (!evicting) {
      EXPECT_EQ(three.token_ids, ref.token_ids);
    }
    // The session went on: its last turn is no longer the one named.
    TurnRequest four = Turn("s", kLines[3], 4, {}, 6);
    four.request_id = "four";
    ASSERT_TRUE(Run(*sched, four).status.ok());
    ASSERT_TRUE(Run(*sched, Turn("s", kLines[0], 6, {}, 6)).status.ok());
    EXPECT_EQ(sched->AbortRequest("four"), 0) << "not the session's last turn any more";
  }
}

// After a stopped reply the client keeps the part it got and writes a new message (as chat
// UIs do): the history then holds the stopped turn's user message, which the worker's copy
// lacks. The cache (as before the stopped turn) goes on with that message, the part and the
// new one, as a session sent the three in one turn does; it used to be rebuilt.
TEST_F(StopCutTest, AStoppedTurnsMessageSentWithThePartOfItsReplyContinuesTheCache) {
  auto sched = StartFull();
  ASSERT_NE(sched, nullptr);
  const model::ChatMessage part = Part();
  const Collected ref = RunThreeAtOnce(*sched, "ref");
  ASSERT_TRUE(ref.status.ok()) << ref.status;

  const Collected one = Run(*sched, Turn("s", kLines[0], 0, {}, 8));
  ASSERT_TRUE(one.status.ok()) << one.status;
  TurnRequest two = Turn("s", kLines[1], 2, {}, 400);
  two.request_id = "two";
  EXPECT_EQ(StopAfterFirstToken(*sched, two).status.code(), absl::StatusCode::kCancelled);

  const double rebuilds = Rebuilds();
  TurnRequest three = Turn("s", kLines[2], 3);
  three.history = {{"user", kLines[0]}, {"assistant", one.summary.text}, {"user", kLines[1]}};
  three.messages = {part, {"user", kLines[2]}};
  const Collected c = Run(*sched, three);
  ASSERT_TRUE(c.status.ok()) << c.status;
  EXPECT_EQ(Rebuilds(), rebuilds) << "continued from its cache";
  EXPECT_EQ(c.summary.cached_tokens, ref.summary.cached_tokens);
  EXPECT_EQ(c.summary.prompt_tokens, ref.summary.prompt_tokens);
  EXPECT_EQ(c.token_ids, ref.token_ids);
  // Its transcript has the caught-up message: the next turn continues as the reference's.
  const Collected ref4 = Run(*sched, Turn("ref", kLines[3], 6));
  ASSERT_TRUE(ref4.status.ok()) << ref4.status;
  const Collected four = Run(*sched, Turn("s", kLines[3], 6));
  ASSERT_TRUE(four.status.ok()) << four.status;
  EXPECT_EQ(Rebuilds(), rebuilds);
  EXPECT_EQ(four.token_ids, ref4.token_ids);
}

// A copy behind by a reply (the session went on on another worker) is rebuilt, replaying that
// reply from its tokens, not continued with its text (which can tokenize otherwise).
TEST_F(StopCutTest, ACopyBehindByAReplyIsRebuiltNotContinued) {
  auto sched = StartFull();
  ASSERT_NE(sched, nullptr);
  const Collected one = Run(*sched, Turn("s", kLines[0], 0, {}, 8));
  ASSERT_TRUE(one.status.ok()) << one.status;
  const double rebuilds = Rebuilds();
  TurnRequest three = Turn("s", kLines[2], 4);
  three.history = {{"user", kLines[0]},
                   {"assistant", one.summary.text},
                   {"user", kLines[1]},
                   {"assistant", " Once there"}};
  // The replies the model gave come with their tokens (the coordinator keeps them).
  three.history_replies = {std::nullopt, ReplyRecord{one.token_ids, one.summary.finish},
                           std::nullopt, ReplyRecord{tok_->Encode(" Once there", false)}};
  const Collected c = Run(*sched, three);
  ASSERT_TRUE(c.status.ok()) << c.status;
  EXPECT_EQ(Rebuilds(), rebuilds + 1);
  EXPECT_TRUE(c.summary.rebuilt);
}

// A stopped turn that brought several messages (the part of an earlier stopped reply, then a
// new message) keeps in the transcript those before its last user message (a complete
// exchange, the reply the client's), which the worker's copy lacks after the abort: they are
// caught up too, the cache going on as a session sent the three at once.
TEST_F(StopCutTest, AStoppedTurnOfSeveralMessagesIsCaughtUpFromItsCache) {
  auto sched = StartFull();
  ASSERT_NE(sched, nullptr);
  const model::ChatMessage part = Part();
  const Collected ref = RunThreeAtOnce(*sched, "ref");
  ASSERT_TRUE(ref.status.ok()) << ref.status;

  const Collected one = Run(*sched, Turn("s", kLines[0], 0, {}, 8));
  ASSERT_TRUE(one.status.ok()) << one.status;
  TurnRequest stopped = ThreeAtOnce("s");
  stopped.max_tokens = 400;
  stopped.request_id = "stopped";
  EXPECT_EQ(StopAfterFirstToken(*sched, stopped).status.code(), absl::StatusCode::kCancelled);

  const double rebuilds = Rebuilds();
  TurnRequest again = Turn("s", kLines[2], 4);
  again.history = {{"user", kLines[0]}, {"assistant", one.summary.text}, {"user", kLines[1]}, part};
  again.history_replies = {std::nullopt, ReplyRecord{one.token_ids, one.summary.finish},
                           std::nullopt, std::nullopt};
  const Collected c = Run(*sched, again);
  ASSERT_TRUE(c.status.ok()) << c.status;
  EXPECT_EQ(Rebuilds(), rebuilds) << "continued from its cache";
  EXPECT_EQ(c.summary.cached_tokens, ref.summary.cached_tokens);
  EXPECT_EQ(c.token_ids, ref.token_ids);

  // A rebuild of that transcript elsewhere (a failover) replays it to the same cache: the
  // reply the client wrote is text of its turn, as the continuation fed it; the same next reply.
  const Collected four = Run(*sched, Turn("s", kLines[3], 6));
  ASSERT_TRUE(four.status.ok()) << four.status;
  TurnRequest rebuild = Turn("elsewhere", kLines[3], 6);
  rebuild.history = {{"user", kLines[0]}, {"assistant", one.summary.text},
                     {"user", kLines[1]}, part,
                     {"user", kLines[2]}, {"assistant", c.summary.text}};
  rebuild.history_replies = {std::nullopt, ReplyRecord{one.token_ids, one.summary.finish},
                             std::nullopt, std::nullopt,
                             std::nullopt, ReplyRecord{c.token_ids, c.summary.finish}};
  const Collected rebuilt = Run(*sched, rebuild);
  ASSERT_TRUE(rebuilt.status.ok()) << rebuilt.status;
  EXPECT_TRUE(rebuilt.summary.rebuilt);
  EXPECT_EQ(rebuilt.token_ids, four.token_ids);
}

// Cut one byte into token j: j is given back and its first byte, which the reply keeps, is fed
// at the next turn.
TEST_F(StopCutTest, ACutInsideATokenKeepsItsTextBeforeTheCutForTheNextTurn) {
  if (model_ == nullptr) return;
  std::unique_ptr<Scheduler> a = StartFull();
  ASSERT_NE(a, nullptr);
  const Collected probe = Run(*a, Turn("probe", kLines[2], 0));
  ASSERT_TRUE(probe.status.ok()) << probe.status;
  ASSERT_GE(probe.token_ids.size(), 30u) << probe.text;
  const std::vector<std::string> pieces = Pieces(probe.token_ids);
  size_t j = 0, before = 0;
  std::string stop;
  for (size_t k = 8; k + 2 < pieces.size() && stop.empty(); ++k) {
    if (pieces[k].size() < 3) continue;
    const std::string s = pieces[k].substr(1) + pieces[k + 1];
    if (probe.text.find(s) != TextBefore(probe, pieces, k) + 1) continue;
    j = k;
    before = TextBefore(probe, pieces, k);
    stop = s;
  }
  ASSERT_FALSE(stop.empty()) << "no token of the reply fits: " << probe.text;

  const Collected cut = Run(*a, Turn("cut", kLines[2], 0, {stop}));
  ASSERT_TRUE(cut.status.ok()) << cut.status;
  EXPECT_EQ(cut.summary.text, probe.text.substr(0, before + 1));
  EXPECT_EQ(cut.summary.held_tokens, cut.summary.prompt_tokens + static_cast<int64_t>(j));
  const Collected next = Run(*a, Turn("cut", kLines[3], 2));
  ASSERT_TRUE(next.status.ok()) << next.status;
  EXPECT_FALSE(next.summary.rebuilt);
  EXPECT_EQ(next.summary.cached_tokens, cut.summary.prompt_tokens + static_cast<int>(j));
  EXPECT_GT(next.summary.generated_tokens, 0);
  // The same turn after a reply that ended by length, one token later: the cut's next
  // prompt has the kept byte's token(s) where that one has the pending token.
  EXPECT_GT(next.summary.prompt_tokens, next.summary.cached_tokens);
  EXPECT_EQ(Rebuilds(), 0);
}

// Replies cut at the end of a sentence, past the context several times: no rebuild, the bound
// held, and each turn continues the cache (a rebuild would have none to count).
TEST_F(StopCutTest, ACompactSessionCutAtEveryTurnGoesOnPastTheContextWithoutARebuild) {
  if (model_ == nullptr) return;
  std::unique_ptr<Scheduler> s = StartCompact();
  ASSERT_NE(s, nullptr);
  const int64_t bound = testing::CompactLazyBound(
      model_->config, engines_.back()->pool(0).block_bytes(), engines_.back()->tp());
  int cut = 0;
  int cached = 0;
  int64_t consumed = 0;
  for (int turn = 0; turn < 40; ++turn) {
    SCOPED_TRACE(turn);
    Collected c = Run(*s, Turn("long", kLines[turn % 6], 2 * turn, {". ", ".\n"}));
    ASSERT_TRUE(c.status.ok()) << c.status;
    EXPECT_FALSE(c.summary.rebuilt);
    EXPECT_LE(c.summary.peak_kv_bytes, bound);
    if (turn > 0) {
      EXPECT_GT(c.summary.cached_tokens, cached);
    }
    cached = c.summary.cached_tokens;
    consumed = c.summary.prompt_tokens + c.summary.generated_tokens;
    cut += Cut(c);
  }
  EXPECT_GT(consumed, 3 * model_->config.max_seq_len) << "past the context 3x";
  EXPECT_GE(cut, 10) << "replies cut at a stop string";
  EXPECT_EQ(Rebuilds(), 0);
}

// A worker died after streaming the token that completed the stop string: the resumed turn
// (all of the reply's tokens) samples nothing more, and its cache is the original's, cut and
// given back alike, so the next turn is the same.
TEST_F(StopCutTest, AResumedReplyThatHadReachedItsStopStringEndsThere) {
  if (model_ == nullptr) return;
  std::unique_ptr<Scheduler> s = StartCompact();
  ASSERT_NE(s, nullptr);
  const std::vector<std::string> stop = {". "};
  const Collected a = Run(*s, Turn("orig", kLines[0], 0, stop));
  ASSERT_TRUE(a.status.ok()) << a.status;
  ASSERT_TRUE(Cut(a)) << a.text;
  const Collected a2 = Run(*s, Turn("orig", kLines[1], 2, stop));
  ASSERT_TRUE(a2.status.ok()) << a2.status;

  TurnRequest r = Turn("resumed", kLines[0], 0, stop);
  r.resume_tokens = a.token_ids;
  const Collected b = Run(*s, r);
  ASSERT_TRUE(b.status.ok()) << b.status;
  EXPECT_TRUE(b.token_ids.empty()) << "nothing sampled after the stop";
  EXPECT_EQ(b.text, "") << "the client has the text already";
  EXPECT_EQ(b.summary.text, a.summary.text);
  EXPECT_EQ(b.summary.finish, TurnFinish::kStop);
  const Collected b2 = Run(*s, Turn("resumed", kLines[1], 2, stop));
  ASSERT_TRUE(b2.status.ok()) << b2.status;
  EXPECT_EQ(b2.token_ids, a2.token_ids);
  EXPECT_EQ(b2.summary.cached_tokens, a2.summary.cached_tokens);
}

// Tensor-parallel ranks give back the same tokens: their replies stay the one rank's.
TEST_F(StopCutTest, TensorParallelRanksCutLikeOneRank) {
  if (model_ == nullptr) return;
  std::unique_ptr<Scheduler> one = StartCompact(1);
  std::unique_ptr<Scheduler> two = StartCompact(2);
  ASSERT_NE(one, nullptr);
  ASSERT_NE(two, nullptr);
  int cut = 0;
  for (int turn = 0; turn < 16; ++turn) {
    SCOPED_TRACE(turn);
    Collected a = Run(*one, Turn("tp", kLines[turn % 6], 2 * turn, {". ", ".\n"}));
    Collected b = Run(*two, Turn("tp", kLines[turn % 6], 2 * turn, {". ", ".\n"}));
    ASSERT_TRUE(a.status.ok() && b.status.ok()) << a.status << b.status;
    EXPECT_EQ(a.token_ids, b.token_ids);
    EXPECT_EQ(a.summary.cached_tokens, b.summary.cached_tokens);
    cut += Cut(a);
  }
  EXPECT_GE(cut, 5) << "replies cut at a stop string";
  EXPECT_EQ(Rebuilds(), 0);
}

}  // namespace
}  // namespace recall::serving
