// The scheduler's "episodic" policy on stories260K: a session runs on one lazy cache until
// its history passes the budget, its episodes are then built in the background while it
// keeps serving, and later turns are routed to the episode of their story, each episode's
// cache caught up with the turns it missed; dropping the session frees every block and host
// byte; episodes and builds over the host budget are not installed or run; bad settings are
// refused by name.
#include <string>
#include <vector>

#include "common/metrics/registry.h"
#include "gtest/gtest.h"
#include "tests/common/stories260k.h"
#include "worker/model/loader.h"
#include "worker/serving/scheduler.h"
#include "worker/serving/turn_collect.h"

namespace recall::serving {
namespace {

const char* const kStories[] = {
    "Lily had a red ball. She played with the ball in the park. The ball went into the pond.",
    "Tom saw a big blue truck. The truck was very loud. Tom waved at the driver of the truck.",
    "Sue baked a cake with her dad. They put sugar and eggs in the cake. The cake was sweet.",
    "Ben found a bird in the garden. The bird had a hurt wing. Ben made a bed for the bird.",
};

class SchedulerEpisodesTest : public recall::testing::Stories260KTest {
 protected:
  void SetUp() override {
    Stories260KTest::SetUp();
    if (model_ == nullptr) return;  // skipped or failed
    backend_ = kernels::CreateCpuBackend({1});
    const model::ModelConfig& c = model_->config;
    auto pool =
        cache::BlockPool::Create({c.n_layers, c.n_kv_heads, c.head_dim, 16}, 64 * c.n_layers);
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = std::move(*pool);
    Start(SchedulerOptions{});
  }

  void Start(SchedulerOptions o) {
    sched_.reset();
    o.stop_token_ids = {2};
    metrics_ = std::make_unique<metrics::Registry>();
    auto s = Scheduler::Create(*model_, *backend_, *pool_, *tok_, o, metrics_.get());
    ASSERT_TRUE(s.ok()) << s.status();
    sched_ = std::move(*s);
  }

  double Counter(const std::string& name, const std::string& labels = "") {
    return metrics_->GetCounter(name, "", labels)->value();
  }

  Collected Run(const std::string& text, int history_length, CacheRequest cache = Cache(),
                std::vector<std::string> stop = {}) {
    TurnRequest r;
    r.stop = std::move(stop);
    r.session_id = "epi";
    r.messages = {{"user", text}};
    r.history_length = history_length;
    r.sampling.temperature = 0;
    r.max_tokens = 8;
    r.cache = cache;
    auto stream = sched_->Submit(std::move(r));
    if (!stream.ok()) return Collected{.status = stream.status()};
    return CollectTurn(**stream);
  }

  static CacheRequest Cache() {
    CacheRequest c;
    c.policy = "episodic";
    c.budget_tokens = 32;
    c.window = 8;
    c.episodes = 2;
    c.embedder = "tfidf";
    c.block_tokens = 64;
    c.recluster_turns = 100;
    return c;
  }

  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<cache::BlockPool> pool_;
  std::unique_ptr<metrics::Registry> metrics_;
  std::unique_ptr<Scheduler> sched_;
};

TEST_F(SchedulerEpisodesTest, EpisodesAreBuiltInTheBackgroundAndTurnsGoToTheirStory) {
  const std::vector<std::string> policies = sched_->policies();
  ASSERT_NE(std::find(policies.begin(), policies.end(), "episodic"), policies.end());
  // Four stories, one per turn: windows of four messages hold two stories each.
  for (int i = 0; i < 4; ++i) {
    Collected c = Run(kStories[i], 2 * i);
    ASSERT_TRUE(c.status.ok()) << c.status;
    EXPECT_TRUE(c.summary.episode_windows.empty()) << "turn " << i << ": not built yet";
    EXPECT_EQ(c.summary.episode, -1);
  }
  sched_->WaitForEpisodeBuilds();  // submitted when turn 4 started (two windows by then)
  // A question about Lily (window 0): the episodes are installed and it goes to hers.
  Collected lily = Run("Lily had a red ball.", 8);
  ASSERT_TRUE(lily.status.ok()) << lily.status;
  ASSERT_EQ(lily.summary.episode_windows, (std::vector<int>{1, 1}));
  ASSERT_GE(lily.summary.episode, 0);
  EXPECT_GT(lily.summary.replayed_tokens, 0) << "turn 4 came after the build's snapshot";
  // A question about Sue (window 1) goes to the other episode, which missed Lily's turn.
  Collected sue = Run("Sue baked a cake with her dad.", 10);
  ASSERT_TRUE(sue.status.ok()) << sue.status;
  EXPECT_NE(sue.summary.episode, lily.summary.episode);
  EXPECT_GT(sue.summary.replayed_tokens, lily.summary.replayed_tokens);
  // Back to Lily: her episode only missed Sue's turn.
  Collected again = Run("The ball went into the pond.", 12);
  ASSERT_TRUE(again.status.ok()) << again.status;
  EXPECT_EQ(again.summary.episode, lily.summary.episode);
  EXPECT_GT(again.summary.replayed_tokens, 0);
  EXPECT_LT(again.summary.replayed_tokens, sue.summary.replayed_tokens);
  EXPECT_EQ(Counter("recall_worker_episode_sets_total", "outcome=\"installed\""), 1);
  EXPECT_EQ(Counter("recall_worker_episode_switches_total"), 2);
  EXPECT_EQ(
      Counter("recall_worker_episode_replayed_tokens_total"),
      lily.summary.replayed_tokens + sue.summary.replayed_tokens + again.summary.replayed_tokens);
  // Dropping the session gives back every block and every host byte.
  ASSERT_TRUE(sched_->DropSession("epi").ok());
  EXPECT_EQ(pool_->free_blocks(), pool_->num_blocks());
  for (int i = 0; i < 50 && sched_->Load().host_bytes_used != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(sched_->Load().host_bytes_used, 0);
}

// Replies cut at a stop string give back their tokens in an episodic session too, before and
// after its episodes are built and while turns switch between them: no turn is rebuilt.
TEST_F(SchedulerEpisodesTest, RepliesCutAtAStopStringGoOnWithoutARebuild) {
  const std::vector<std::string> stop = {"e "};
  int cut = 0;
  const auto run = [&](const std::string& text, int history) {
    Collected c = Run(text, history, Cache(), stop);
    EXPECT_TRUE(c.status.ok()) << c.status;
    EXPECT_FALSE(c.summary.rebuilt) << text;
    cut += testing::CutAtStopString(*tok_, c.token_ids, c.summary.text);
    return c;
  };
  for (int i = 0; i < 4; ++i) run(kStories[i], 2 * i);
  sched_->WaitForEpisodeBuilds();
  const Collected lily = run("Lily had a red ball.", 8);
  ASSERT_EQ(lily.summary.episode_windows.size(), 2u) << "episodes installed";
  run("Sue baked a cake with her dad.", 10);
  run("The ball went into the pond.", 12);
  run("Sue and her dad ate the cake.", 14);
  EXPECT_GE(Counter("recall_worker_episode_switches_total"), 1);
  EXPECT_GE(cut, 3) << "replies cut at the stop string, of 8";
  EXPECT_EQ(Counter("recall_worker_rebuilds_total"), 0);
}

// An offloaded episodic session switching episode (another session's prompt took the pool)
// keeps the host-byte count exact: the evictor's state it had on the host goes with the old
// episode's evictor, the new one's is counted. Dropping both sessions gives back every byte.
TEST_F(SchedulerEpisodesTest, AnOffloadedSessionSwitchingEpisodeKeepsTheHostCountExact) {
  const model::ModelConfig& c = model_->config;
  sched_.reset();
  auto pool = cache::BlockPool::Create({c.n_layers, c.n_kv_heads, c.head_dim, 16}, 24 * c.n_layers);
  ASSERT_TRUE(pool.ok()) << pool.status();
  pool_ = std::move(*pool);
  Start(SchedulerOptions{});
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(Run(kStories[i], 2 * i).status.ok());
  sched_->WaitForEpisodeBuilds();
  Collected lily = Run("Lily had a red ball.", 8);
  ASSERT_TRUE(lily.status.ok()) << lily.status;
  ASSERT_GE(lily.summary.episode, 0);
  // A prompt that needs nearly the whole pool: the idle episodic session is offloaded.
  std::string big;
  while (tok_->Encode(big, true).size() < 330) big += std::string(kStories[big.size() % 4]) + " ";
  TurnRequest r;
  r.session_id = "big";
  r.messages = {{"user", big}};
  r.sampling.temperature = 0;
  r.max_tokens = 4;
  auto stream = sched_->Submit(std::move(r));
  ASSERT_TRUE(stream.ok()) << stream.status();
  const Collected bigc = CollectTurn(**stream);
  ASSERT_TRUE(bigc.status.ok()) << bigc.status;
  EXPECT_GT(sched_->Load().offloaded_sessions, 0);
  // Sue's turn switches the offloaded session to the other episode.
  Collected sue = Run("Sue baked a cake with her dad.", 10);
  ASSERT_TRUE(sue.status.ok()) << sue.status;
  EXPECT_NE(sue.summary.episode, lily.summary.episode);
  ASSERT_TRUE(sched_->DropSession("epi").ok());
  sched_->DropSession("big").IgnoreError();  // offloaded or dropped to make room: either way
  EXPECT_EQ(pool_->free_blocks(), pool_->num_blocks());
  for (int i = 0; i < 50 && sched_->Load().host_bytes_used != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(sched_->Load().host_bytes_used, 0);
}

TEST_F(SchedulerEpisodesTest, EpisodesThatDoNotFitTheHostBudgetAreNotInstalled) {
  SchedulerOptions o;
  o.host_cache_bytes = 64 << 10;  // two episodes of 32 slots in 5 layers take 80 KiB
  Start(o);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(Run(kStories[i], 2 * i).status.ok());
  sched_->WaitForEpisodeBuilds();
  Collected next = Run("Lily had a red ball.", 8);
  ASSERT_TRUE(next.status.ok()) << next.status;
  EXPECT_TRUE(next.summary.episode_windows.empty()) << "served without episodes";
  EXPECT_EQ(Counter("recall_worker_episode_sets_total", "outcome=\"over_host_budget\""), 1);
  EXPECT_LE(sched_->Load().host_bytes_used, o.host_cache_bytes);
}

// A build holds host memory while it runs (its own pool and its episodes' copies): it is
// counted against the host budget too. With room for the two episodes' copies (80 KiB) but
// not also for the build's pool, the build waits (it ran before, past the budget) and the
// session is served without episodes; it is counted once, not at every turn.
TEST_F(SchedulerEpisodesTest, ABuildThatDoesNotFitTheHostBudgetWaits) {
  SchedulerOptions o;
  o.host_cache_bytes = 96 << 10;
  Start(o);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(Run(kStories[i], 2 * i).status.ok());
  sched_->WaitForEpisodeBuilds();
  for (int i = 0; i < 2; ++i) {
    Collected next = Run(i == 0 ? "Lily had a red ball." : "Tom saw a truck.", 8 + 2 * i);
    ASSERT_TRUE(next.status.ok()) << next.status;
    EXPECT_TRUE(next.summary.episode_windows.empty()) << "served without episodes";
    sched_->WaitForEpisodeBuilds();
  }
  EXPECT_EQ(Counter("recall_worker_episode_sets_total", "outcome=\"installed\""), 0);
  EXPECT_EQ(Counter("recall_worker_episode_sets_total", "outcome=\"over_host_budget\""), 1);
  EXPECT_LE(sched_->Load().host_bytes_used, o.host_cache_bytes);
}

TEST_F(SchedulerEpisodesTest, BadEpisodicSettingsAreRefusedByName) {
  CacheRequest c = Cache();
  c.episodes = 0;
  EXPECT_EQ(Run("hi", 0, c).status.message(), "cache.episodes: must be in [1, 16], got 0");
  c = Cache();
  c.embedder = "bert";
  EXPECT_EQ(Run("hi", 0, c).status.message(),
            "cache.embedder: unknown embedder \"bert\" (one of model, tfidf)");
  c = Cache();
  c.block_tokens = 8;
  EXPECT_EQ(Run("hi", 0, c).status.message(), "cache.block_tokens: must be in [16, 65536], got 8");
  c = Cache();
  c.budget_tokens.reset();
  c.budget_fraction = 0.5;
  // A fraction is of the context length, in tokens (episodes are built to a token budget).
  Collected f = Run("hi", 0, c);
  EXPECT_TRUE(f.status.ok()) << f.status;
  EXPECT_GT(f.summary.generated_tokens, 0);
}

}  // namespace
}  // namespace recall::serving
