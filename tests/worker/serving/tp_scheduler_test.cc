// The Scheduler on a tensor-parallel group (stories260K, CPU ranks): several concurrent
// multi-turn sessions give exactly the one-rank scheduler's tokens at TP = 2 and 4, with
// and without eviction in every TP eviction mode (and the same eviction counts and KV
// bytes, so the ranks kept what one rank keeps); under memory pressure every rank's slice
// is offloaded and restored together; bad settings are refused by name.
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/worker/runtime/tp_fixture.h"
#include "worker/serving/scheduler.h"
#include "worker/serving/tp_ranks.h"
#include "worker/serving/turn_collect.h"

namespace recall::serving {
namespace {

using runtime::tp::TpFixture;

constexpr int kBlockTokens = 16;

struct Outcome {
  std::vector<std::vector<int32_t>> tokens;  // per turn, in submission order
  std::vector<TurnSummary> summaries;
  int max_offloaded = 0;  // the most sessions seen offloaded between rounds
};

class TpSchedulerTest : public TpFixture {
 protected:
  // Room for `blocks_per_layer` blocks of 16 tokens in every layer (on every rank).
  std::unique_ptr<Scheduler> StartOneRank(int64_t blocks_per_layer, SchedulerOptions o) {
    const model::ModelConfig& c = model_->config;
    backend_ = kernels::CreateCpuBackend({2});
    auto pool = cache::BlockPool::Create({c.n_layers, c.n_kv_heads, c.head_dim, kBlockTokens},
                                         blocks_per_layer * c.n_layers);
    EXPECT_TRUE(pool.ok()) << pool.status();
    pool_ = std::move(*pool);
    o.stop_token_ids = {2};
    auto s = Scheduler::Create(*model_, *backend_, *pool_, *tok_, o);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? std::move(*s) : nullptr;
  }

  // `opaque`: the CUDA ranks' code paths on the CPU
  // (runtime::tp::TpGroupOptions::opaque_cpu_memory).
  std::unique_ptr<Scheduler> StartTp(int tp, int64_t blocks_per_layer, SchedulerOptions o,
                                     bool opaque = false) {
    const model::ModelConfig& c = model_->config;
    runtime::tp::TpGroupOptions g;
    g.tp = tp;
    g.opaque_cpu_memory = opaque;
    g.threads_per_rank = 1;
    g.block_tokens = kBlockTokens;
    // A rank's block holds its KV heads' share of a full block.
    const int64_t rank_block_bytes =
        int64_t{kBlockTokens} * (c.n_kv_heads / tp) * c.head_dim * 2 * sizeof(float);
    g.kv_bytes_per_rank = blocks_per_layer * c.n_layers * rank_block_bytes;
    g.forward.max_batch_tokens = o.max_batch_tokens;
    g.forward.batch_invariant = true;
    auto group = runtime::tp::TpGroup::Create(*model_, g);
    EXPECT_TRUE(group.ok()) << group.status();
    if (!group.ok()) return nullptr;
    group_ = std::move(*group);
    EXPECT_EQ(group_->pool(0).num_blocks(), blocks_per_layer * c.n_layers);
    o.stop_token_ids = {2};
    auto s = Scheduler::Create(*model_, SchedulerRanksOf(*group_), *tok_, o);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? std::move(*s) : nullptr;
  }

  static TurnRequest Turn(const std::string& session, const std::string& text, int history_length,
                          const CacheRequest& cache) {
    TurnRequest r;
    r.session_id = session;
    r.messages = {{"user", text}};
    r.history_length = history_length;
    r.sampling.temperature = 0;
    r.max_tokens = 48;
    r.cache = cache;
    return r;
  }

  // Two rounds: every session's first turn at once, then every session's follow-up at once.
  static Outcome Converse(Scheduler& s, const CacheRequest& cache) {
    const std::vector<std::string> openings = {"Once upon a time", "Lily had a red ball",
                                               "The dog ran to the park", "Tom was sad"};
    Outcome out;
    for (int round = 0; round < 2; ++round) {
      std::vector<std::shared_ptr<TurnStream>> streams;
      for (size_t i = 0; i < openings.size(); ++i) {
        auto st =
            s.Submit(Turn("s" + std::to_string(i), round == 0 ? openings[i] : "What happened next?",
                          2 * round, cache));
        EXPECT_TRUE(st.ok()) << st.status();
        if (!st.ok()) return out;
        streams.push_back(*st);
      }
      for (auto& stream : streams) {
        Collected c = CollectTurn(*stream);
        EXPECT_TRUE(c.status.ok()) << c.status;
        out.tokens.push_back(c.token_ids);
        out.summaries.push_back(c.summary);
      }
      out.max_offloaded = std::max(out.max_offloaded, s.Load().offloaded_sessions);
    }
    return out;
  }

  // The same tokens, (layer, KV head) compactions and evicted slots (summed over the ranks),
  // and KV bytes if asked, turn by turn; and some eviction, or the comparison says nothing.
  static void ExpectSameTurns(const Outcome& got, const Outcome& want, bool same_kv_bytes) {
    ASSERT_EQ(got.tokens.size(), want.tokens.size());
    int64_t evicted = 0;
    for (size_t i = 0; i < want.tokens.size(); ++i) {
      EXPECT_EQ(got.tokens[i], want.tokens[i]) << "turn " << i;
      EXPECT_EQ(got.summaries[i].evictions, want.summaries[i].evictions) << "turn " << i;
      EXPECT_EQ(got.summaries[i].evicted_tokens, want.summaries[i].evicted_tokens) << "turn " << i;
      if (same_kv_bytes) {
        // The KV bytes; the policy's state is each rank's own (replicated for a shared token
        // set, and laid out by the backend that holds it), so only its presence compares.
        EXPECT_EQ(got.summaries[i].kv_bytes - got.summaries[i].state_bytes,
                  want.summaries[i].kv_bytes - want.summaries[i].state_bytes)
            << "turn " << i;
        EXPECT_EQ(got.summaries[i].state_bytes > 0, want.summaries[i].state_bytes > 0)
            << "turn " << i;
      }
      evicted += got.summaries[i].evicted_tokens;
    }
    EXPECT_GT(evicted, 0) << "the budget must force evictions for this test to mean anything";
  }

  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<cache::BlockPool> pool_;
  std::unique_ptr<runtime::tp::TpGroup> group_;
};

class TpSchedulerTpTest : public TpSchedulerTest, public ::testing::WithParamInterface<int> {};

TEST_P(TpSchedulerTpTest, ConcurrentSessionsMatchOneRankWithFullCaches) {
  std::unique_ptr<Scheduler> one = StartOneRank(256, {});
  ASSERT_NE(one, nullptr);
  const Outcome want = Converse(*one, {});
  std::unique_ptr<Scheduler> many = StartTp(GetParam(), 256, {});
  ASSERT_NE(many, nullptr);
  EXPECT_EQ(many->tp(), GetParam());
  const Outcome got = Converse(*many, {});
  ASSERT_EQ(got.tokens.size(), want.tokens.size());
  for (size_t i = 0; i < want.tokens.size(); ++i) {
    EXPECT_FALSE(want.tokens[i].empty());
    EXPECT_EQ(got.tokens[i], want.tokens[i]) << "turn " << i;
    // Follow-ups reuse the cache on every rank alike.
    EXPECT_EQ(got.summaries[i].cached_tokens, want.summaries[i].cached_tokens) << "turn " << i;
    // The ranks' slices add up to one full cache.
    EXPECT_EQ(got.summaries[i].kv_bytes, want.summaries[i].kv_bytes) << "turn " << i;
  }
}

TEST_P(TpSchedulerTpTest, OffloadsAndRestoresEveryRankTogether) {
  // Room for about two sessions at a time: the others are offloaded between their turns.
  SchedulerOptions o;
  std::unique_ptr<Scheduler> roomy = StartTp(GetParam(), 256, o);
  ASSERT_NE(roomy, nullptr);
  const Outcome want = Converse(*roomy, {});
  EXPECT_EQ(want.max_offloaded, 0);
  roomy.reset();
  // Opaque: pools in memory the host may not read, as on CUDA ranks (offload and restore
  // copy through it; activations are all-reduced through the staged group).
  for (const bool opaque : {false, true}) {
    SCOPED_TRACE(opaque ? "opaque memory" : "host memory");
    std::unique_ptr<Scheduler> tight = StartTp(GetParam(), 14, o, opaque);
    ASSERT_NE(tight, nullptr);
    EXPECT_EQ(group_->collectives(), opaque ? "staged" : "in-process");
    const Outcome got = Converse(*tight, {});
    EXPECT_GT(got.max_offloaded, 0);
    ASSERT_EQ(got.tokens.size(), want.tokens.size());
    for (size_t i = 0; i < want.tokens.size(); ++i) {
      EXPECT_EQ(got.tokens[i], want.tokens[i]) << "turn " << i;
    }
    // Every second-round turn continued its cache (restored from host memory when offloaded).
    for (size_t i = 4; i < got.summaries.size(); ++i) {
      EXPECT_FALSE(got.summaries[i].rebuilt);
      EXPECT_EQ(got.summaries[i].cached_tokens, want.summaries[i].cached_tokens);
    }
    tight.reset();
  }
}

INSTANTIATE_TEST_SUITE_P(Tp, TpSchedulerTpTest, ::testing::Values(2, 4));

// (policy, TP eviction mode, tp)
class TpSchedulerEvictionTest
    : public TpSchedulerTest,
      public ::testing::WithParamInterface<std::tuple<std::string, std::string, int>> {};

TEST_P(TpSchedulerEvictionTest, EvictingSessionsMatchOneRankInEveryMode) {
  const auto& [policy, mode, tp] = GetParam();
  CacheRequest cache;
  cache.policy = policy;
  cache.budget_tokens = 24;
  cache.window = 8;
  cache.tp_eviction = mode;
  SchedulerOptions o;
  o.cache.verify_tp_keep = true;  // every eviction step checks that all ranks kept the same tokens
  std::unique_ptr<Scheduler> one = StartOneRank(256, o);
  ASSERT_NE(one, nullptr);
  const Outcome want = Converse(*one, cache);
  std::unique_ptr<Scheduler> many = StartTp(tp, 256, o);
  ASSERT_NE(many, nullptr);
  const Outcome got = Converse(*many, cache);
  // Head-adaptive heads are uneven: each rank's longest head sets its blocks.
  ExpectSameTurns(got, want, /*same_kv_bytes=*/mode != "head-adaptive");
}

INSTANTIATE_TEST_SUITE_P(Modes, TpSchedulerEvictionTest,
                         ::testing::Combine(::testing::Values("lazy", "h2o"),
                                            ::testing::Values("uniform", "shared", "head-adaptive"),
                                            ::testing::Values(2, 4)),
                         [](const auto& info) {
                           std::string mode = std::get<1>(info.param);
                           std::replace(mode.begin(), mode.end(), '-', '_');
                           return std::get<0>(info.param) + "_" + mode + "_tp" +
                                  std::to_string(std::get<2>(info.param));
                         });

// On ranks whose memory is not host memory (GPU ranks; here opaque CPU memory) lazy steps on
// the backend: probabilities stay in the forward pass's scratch, the state in rank memory.
TEST_F(TpSchedulerTest, LazyStepsOnTheRanksBackendsAndMatchesOneHostRank) {
  CacheRequest cache;
  cache.policy = "lazy";
  cache.budget_tokens = 24;
  cache.window = 8;
  SchedulerOptions o;
  o.cache.verify_tp_keep = true;
  std::unique_ptr<Scheduler> one = StartOneRank(256, o);
  ASSERT_NE(one, nullptr);
  const Outcome want = Converse(*one, cache);
  std::unique_ptr<Scheduler> many = StartTp(2, 256, o, /*opaque=*/true);
  ASSERT_NE(many, nullptr);
  ExpectSameTurns(Converse(*many, cache), want, /*same_kv_bytes=*/true);
}

TEST_F(TpSchedulerTest, UnknownTpEvictionModeIsRefusedByName) {
  std::unique_ptr<Scheduler> s = StartTp(2, 64, {});
  ASSERT_NE(s, nullptr);
  CacheRequest cache;
  cache.policy = "lazy";
  cache.tp_eviction = "majority";
  auto st = s->Submit(Turn("x", "Hello", 0, cache));
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.status().message().find("cache.tp_eviction"), std::string::npos) << st.status();
  EXPECT_NE(st.status().message().find("head-adaptive"), std::string::npos) << st.status();
}

// A mode the policy cannot take is refused when the session is checked at its creation, by
// name, not by each of its turns ("session evictor: share_tokens does not apply ...").
TEST_F(TpSchedulerTest, AModeThePolicyCannotTakeIsRefusedWhenTheSessionIsMade) {
  std::unique_ptr<Scheduler> s = StartTp(2, 64, {});
  ASSERT_NE(s, nullptr);
  for (const auto& [policy, mode, why] :
       {std::tuple{"rkv", "shared", "it scores each KV head by its own keys"},
        std::tuple{"tova", "head-adaptive", "keeps one token set for all heads of a layer"}}) {
    CacheRequest cache;
    cache.policy = policy;
    cache.budget_tokens = 32;
    cache.tp_eviction = mode;
    const absl::StatusOr<int> checked = s->CheckSession(cache, "");
    ASSERT_FALSE(checked.ok()) << policy;
    EXPECT_EQ(checked.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(checked.status().message().rfind("cache.tp_eviction: ", 0), 0u) << checked.status();
    EXPECT_NE(checked.status().message().find(why), std::string::npos) << checked.status();
  }
  // Episodic sessions run on one CPU rank: said so, not "unknown policy" (a tester).
  CacheRequest episodic;
  episodic.policy = "episodic";
  const absl::StatusOr<int> checked = s->CheckSession(episodic, "");
  EXPECT_EQ(checked.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(checked.status().message().rfind(
                "cache.policy: episodic sessions run on a worker of one CPU rank; this one runs "
                "tensor-parallel or GPU ranks (one of full, ",
                0),
            0u)
      << checked.status();
}

}  // namespace
}  // namespace recall::serving
