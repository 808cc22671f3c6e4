// SessionEvictor with the two-phase selection: head-adaptive budgets (Ada-KV) and the CAOTE
// meta-score.
#include <algorithm>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "cache/block_pool.h"
#include "cache/eviction/session_evictor.h"
#include "cache/sequence_cache.h"
#include "gtest/gtest.h"
#include "tests/cache/eviction/append_rows.h"

namespace recall::cache::eviction {
namespace {

// 2 layers, 2 KV heads, 4 query heads (G = 2), head_dim 4, blocks of 4 tokens.
class SessionEvictorMetaTest : public ::testing::Test {
 protected:
  static constexpr int kLayers = 2, kKv = 2, kHeads = 4, kDim = 4, kStride = 64;
  using RowFn = testing::RowFn;

  void SetUp() override {
    auto pool = BlockPool::Create(layout_, 128);  // 64 blocks of 4 tokens per layer
    ASSERT_TRUE(pool.ok());
    pool_ = std::move(*pool);
  }

  static float DefaultV(int pos, int l, int h, int d) {
    return d == 0 ? 1.0f + pos + 1000.0f * l + 100.0f * h : 0.0f;
  }

  // Appends n tokens; K and V rows from the given functions.
  void Append(SequenceCache& seq, int n, const RowFn& k_fn, const RowFn& v_fn) {
    testing::AppendRows(seq, n, k_fn, v_fn);
  }
  void Append(SequenceCache& seq, int n) {
    Append(
        seq, n, [](int, int, int, int) { return 0.0f; }, DefaultV);
  }

  // probs[l][qh][s] = p(kv head of qh, s), the same in both layers.
  static std::vector<float> Probs(const std::function<float(int kv_head, int slot)>& p, int len) {
    std::vector<float> probs(static_cast<size_t>(kLayers) * kHeads * kStride, 0.0f);
    for (int l = 0; l < kLayers; ++l) {
      for (int qh = 0; qh < kHeads; ++qh) {
        for (int s = 0; s < len; ++s) {
          probs[(static_cast<size_t>(l) * kHeads + qh) * kStride + s] = p(qh / (kHeads / kKv), s);
        }
      }
    }
    return probs;
  }

  std::unique_ptr<SessionEvictor> Make(SequenceCache* seq, const SessionEvictorOptions& o) {
    absl::StatusOr<std::unique_ptr<SessionEvictor>> e = SessionEvictor::Create(o, seq);
    EXPECT_TRUE(e.ok()) << e.status();
    return e.ok() ? std::move(*e) : nullptr;
  }

  static SessionEvictorOptions Options(const std::string& policy, int budget, int window) {
    SessionEvictorOptions o;
    o.policy.name = policy;
    o.policy.window = window;
    o.policy.alpha = 0.05f;
    o.budget.budget = budget;
    o.n_heads = kHeads;
    return o;
  }

  static std::vector<int32_t> Positions(const SequenceCache& seq, int l, int h) {
    std::vector<int32_t> p;
    for (int s = 0; s < seq.length(l, h); ++s) p.push_back(seq.position(l, h, s));
    return p;
  }

  kernels::PagedKvLayout layout_{kLayers, kKv, kDim, 4};
  std::unique_ptr<BlockPool> pool_;
};

// Scenario: h2o, W = 2, C = 6, 13 slots at step 1. KV head 0 attends to slot 0 (0.9, the rest
// 0.001 * (13 - j)); KV head 1 is spread (0.05 + 0.001 j). Each head's quota is C - W = 4, the
// layer's 8. Head-adaptive with the default safeguard (floor(0.2 * 4) = 0): the global top 8
// is h0:0 and h1:4..10, so head 0 keeps 3 slots and head 1 keeps 9 (12 = 2 * C in all); V
// moves with its token; states stay in step. With safeguard 0.5 every head first keeps its
// top 2: head 0 {0, 1}, head 1 {9, 10}, then h1:5..8. Uniform mode keeps 6 per head.
TEST_F(SessionEvictorMetaTest, HeadAdaptiveBudgetsFollowTheGlobalTopK) {
  const auto p = [](int kh, int s) {
    return kh == 0 ? (s == 0 ? 0.9f : 0.001f * (13 - s)) : 0.05f + 0.001f * s;
  };
  struct Case {
    bool adaptive;
    double safeguard;
    std::vector<int32_t> head0, head1;
  };
  const std::vector<Case> cases = {{true, 0.2, {0, 11, 12}, {4, 5, 6, 7, 8, 9, 10, 11, 12}},
                                   {true, 0.5, {0, 1, 11, 12}, {5, 6, 7, 8, 9, 10, 11, 12}},
                                   {false, 0.2, {0, 1, 2, 3, 11, 12}, {7, 8, 9, 10, 11, 12}}};
  for (const Case& c : cases) {
    SequenceCache seq(pool_.get());
    SessionEvictorOptions o = Options("h2o", 6, 2);
    o.budget.head_adaptive = c.adaptive;
    o.budget.head_safeguard = c.safeguard;
    std::unique_ptr<SessionEvictor> ev = Make(&seq, o);
    ASSERT_NE(ev, nullptr);
    Append(seq, 12);
    Append(seq, 1);
    const std::vector<float> probs = Probs(p, 13);
    ASSERT_TRUE(ev->Step(probs.data(), kStride).ok());
    for (int l = 0; l < kLayers; ++l) {
      EXPECT_EQ(Positions(seq, l, 0), c.head0) << c.adaptive << " " << c.safeguard;
      EXPECT_EQ(Positions(seq, l, 1), c.head1) << c.adaptive << " " << c.safeguard;
      for (int h = 0; h < kKv; ++h) {
        EXPECT_EQ(ev->state(l, h).size(), seq.length(l, h));
        for (int s = 0; s < seq.length(l, h); ++s) {
          EXPECT_EQ(seq.View().V(l, h, s)[0], DefaultV(seq.position(l, h, s), l, h, 0));
        }
      }
    }
    EXPECT_EQ(ev->evictions(), kLayers * kKv);
    EXPECT_EQ(ev->evicted_slots(), kLayers * (2 * 13 - 2 * 6));
  }
}

// Scenario: the longest head of a layer sets the blocks that layer holds (its block table is
// shared by its heads): after the head-adaptive eviction above, 9 slots need 3 blocks per
// layer where uniform mode needs 2.
TEST_F(SessionEvictorMetaTest, HeadAdaptiveMemoryFollowsTheLongestHead) {
  SequenceCache seq(pool_.get());
  SessionEvictorOptions o = Options("h2o", 6, 2);
  o.budget.head_adaptive = true;
  std::unique_ptr<SessionEvictor> ev = Make(&seq, o);
  ASSERT_NE(ev, nullptr);
  Append(seq, 13);
  const std::vector<float> probs = Probs(
      [](int kh, int s) { return kh == 0 ? (s == 0 ? 0.9f : 0.001f) : 0.05f + 0.001f * s; }, 13);
  ASSERT_TRUE(ev->Step(probs.data(), kStride).ok());
  EXPECT_EQ(seq.max_length(), 9);
  EXPECT_EQ(seq.num_blocks(), 2 * 3);
}

// Scenario: lazy, W = 4, C = 8, head-adaptive, prompt 6, 60 pseudo-random steps (both layers
// see the same probabilities, so they evolve alike): at every eviction step (t % 4 == 0; the
// layer holds more than 2 * C from t = 2 on) the layer ends with exactly 2 * C slots, the
// heads' lengths differ, states stay in step, and a second run keeps the same slots.
TEST_F(SessionEvictorMetaTest, HeadAdaptiveLazyKeepsTheLayerBudgetAndIsDeterministic) {
  const auto run = [&](SequenceCache& seq) {
    SessionEvictorOptions o = Options("lazy", 8, 4);
    o.budget.head_adaptive = true;
    std::unique_ptr<SessionEvictor> ev = Make(&seq, o);
    ASSERT_NE(ev, nullptr);
    Append(seq, 6);
    bool uneven = false;
    for (int t = 1; t <= 60; ++t) {
      Append(seq, 1);
      const std::vector<float> probs = Probs(
          [&](int kh, int s) {
            if (s >= seq.length(0, kh)) return 0.0f;
            uint32_t x = static_cast<uint32_t>(seq.position(0, kh, s)) * 2654435761u ^
                         static_cast<uint32_t>(t * 40503 + kh * 977);
            x ^= x >> 13;
            x *= 0x5bd1e995u;
            x ^= x >> 15;
            return static_cast<float>(x % 1000) * (kh == 0 ? 2e-4f : 1e-4f);
          },
          seq.max_length());
      ASSERT_TRUE(ev->Step(probs.data(), kStride).ok());
      for (int l = 0; l < kLayers; ++l) {
        const int total = seq.length(l, 0) + seq.length(l, 1);
        if (t % 4 == 0) {
          EXPECT_EQ(total, 2 * 8) << "t=" << t;
        }
        for (int h = 0; h < kKv; ++h) EXPECT_EQ(ev->state(l, h).size(), seq.length(l, h));
      }
      uneven |= seq.length(0, 0) != seq.length(0, 1);
    }
    EXPECT_TRUE(uneven) << "expected the heads' lengths to differ at some step";
  };
  SequenceCache a(pool_.get()), b(pool_.get());
  run(a);
  run(b);
  for (int l = 0; l < kLayers; ++l) {
    for (int h = 0; h < kKv; ++h) EXPECT_EQ(Positions(a, l, h), Positions(b, l, h));
  }
}

// Scenario: SnapKV at prefill, head-adaptive, prompt 20, w = 4, C = 8 (quota 4 per head).
// Head 0's key 0 is large along the query, so head 0's window attends to slot 0 and its pooled
// scores are high only for slots 0..2; head 1's keys are 0, so its attention is uniform and
// its interior candidates tie. Global top 8: h0:0..2, then h1's older ties 2..6.
TEST_F(SessionEvictorMetaTest, HeadAdaptiveSnapKvAtPrefill) {
  SequenceCache seq(pool_.get());
  SessionEvictorOptions o = Options("snapkv", 8, 4);
  o.budget.head_adaptive = true;
  std::unique_ptr<SessionEvictor> ev = Make(&seq, o);
  ASSERT_NE(ev, nullptr);
  Append(
      seq, 20,
      [](int pos, int, int h, int d) { return h == 0 && pos == 0 && d == 0 ? 10.0f : 0.0f; },
      DefaultV);
  std::vector<float> queries(static_cast<size_t>(kLayers) * 4 * kHeads * kDim, 0.0f);
  for (size_t i = 0; i < queries.size(); i += kDim) queries[i] = 1.0f;
  ASSERT_TRUE(ev->CompressPrefill(queries.data(), 4).ok());
  for (int l = 0; l < kLayers; ++l) {
    EXPECT_EQ(Positions(seq, l, 0), (std::vector<int32_t>{0, 1, 2, 16, 17, 18, 19}));
    EXPECT_EQ(Positions(seq, l, 1), (std::vector<int32_t>{2, 3, 4, 5, 6, 16, 17, 18, 19}));
  }
  Append(seq, 1);
  const std::vector<float> probs(static_cast<size_t>(kLayers) * kHeads * kStride, 0.01f);
  EXPECT_TRUE(ev->Step(probs.data(), kStride).ok());
}

// Scenario: CAOTE on h2o, W = 2, C = 4, 6 slots at step 1 with attention (0.4, 0.3, 0.2, 0.1,
// 0, 0) in every head and V rows v = (x, 0, 0, 0), x = (0, 1, -1.5, 0, 0, 0). The candidates
// 0..3 have a = (0.4, 0.3, 0.2, 0.1), o = 0.3 - 0.3 = 0, so c = (0, 0.3/0.7, 0.2/0.8 * 1.5, 0)
// = (0, 0.43, 0.375, 0): CAOTE keeps 1 and 2 where H2O keeps 0 and 1 (plus the window 4, 5).
// The current-query form sees the same distribution over all 6 slots (the window's a is 0)
// and keeps the same.
TEST_F(SessionEvictorMetaTest, CaoteReranksByValueDeviation) {
  const float x[6] = {0.0f, 1.0f, -1.5f, 0.0f, 0.0f, 0.0f};
  const RowFn v = [&x](int pos, int, int, int d) { return d == 0 ? x[pos] : 0.0f; };
  const RowFn zero = [](int, int, int, int) { return 0.0f; };
  const float a[6] = {0.4f, 0.3f, 0.2f, 0.1f, 0.0f, 0.0f};
  const std::vector<float> probs = Probs([&a](int, int s) { return a[s]; }, 6);
  using Meta = PolicyOptions::MetaScore;
  struct Case {
    std::string policy;
    int budget;
    Meta meta;
    std::vector<int32_t> kept;
  };
  const std::vector<Case> cases = {
      {"h2o", 4, Meta::kNone, {0, 1, 4, 5}},
      {"h2o", 4, Meta::kCaote, {1, 2, 4, 5}},
      {"h2o", 4, Meta::kCaoteCurrentQuery, {1, 2, 4, 5}},
      // TOVA: one set for the layer, CAOTE summed over the KV heads.
      {"tova", 2, Meta::kNone, {0, 1}},
      {"tova", 2, Meta::kCaote, {1, 2}},
      {"tova", 2, Meta::kCaoteCurrentQuery, {1, 2}},
      // Streaming ignores attention; the current-query CAOTE replaces its recency score.
      {"streaming", 3, Meta::kCaoteCurrentQuery, {0, 1, 2}}};
  for (const Case& c : cases) {
    SequenceCache seq(pool_.get());
    SessionEvictorOptions o = Options(c.policy, c.budget, 2);
    o.policy.sinks = 1;
    o.policy.meta_score = c.meta;
    std::unique_ptr<SessionEvictor> ev = Make(&seq, o);
    ASSERT_NE(ev, nullptr);
    Append(seq, 6, zero, v);
    ASSERT_TRUE(ev->Step(probs.data(), kStride).ok()) << c.policy;
    for (int l = 0; l < kLayers; ++l) {
      for (int h = 0; h < kKv; ++h) {
        EXPECT_EQ(Positions(seq, l, h), c.kept) << c.policy << " meta " << static_cast<int>(c.meta);
      }
    }
  }
}

TEST_F(SessionEvictorMetaTest, BadCombinationsAreRejected) {
  SequenceCache seq(pool_.get());
  SessionEvictorOptions o = Options("tova", 8, 4);
  o.budget.head_adaptive = true;
  absl::StatusOr<std::unique_ptr<SessionEvictor>> e = SessionEvictor::Create(o, &seq);
  ASSERT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("head-adaptive needs per-KV-head budgets"),
            absl::string_view::npos)
      << e.status();

  o = Options("streaming", 8, 4);
  o.policy.meta_score = PolicyOptions::MetaScore::kCaoteCurrentQuery;
  std::unique_ptr<SessionEvictor> ev = Make(&seq, o);
  ASSERT_NE(ev, nullptr);
  Append(seq, 10);
  EXPECT_EQ(ev->Step(nullptr, 0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ev->step(), 0);
}

// Scenario: merging (PolicyOptions::merge, merge.h) with streaming, 2 sinks, C = 6: 10 slots
// keep {0, 1, 6, 7, 8, 9}. Evicted slot 2 has slot 6's key and slot 3 has slot 7's; slots 4
// and 5 point where no kept key does. Streaming reads no attention, so the weights are equal:
// the kept V rows of 6 and 7 become the means (v6 + v2) / 2 and (v7 + v3) / 2, slots 4 and 5
// are dropped, every other kept row and every key is unchanged (keys merge only with
// merge_keys). Without merging nothing but the slots moves.
TEST_F(SessionEvictorMetaTest, MergingMovesEvictedValuesIntoTheKeptSlotOfTheSameKey) {
  const RowFn k_fn = [](int pos, int, int, int d) {
    const int dir = pos == 2 || pos == 6   ? 0
                    : pos == 3 || pos == 7 ? 1
                    : pos == 4 || pos == 5 ? 2
                                           : 3;
    return d == dir ? 1.0f : 0.0f;
  };
  for (const bool merge : {false, true}) {
    SequenceCache seq(pool_.get());
    SessionEvictorOptions o = Options("streaming", 6, 2);
    o.policy.sinks = 2;
    o.policy.merge = merge;
    std::unique_ptr<SessionEvictor> ev = Make(&seq, o);
    ASSERT_NE(ev, nullptr);
    Append(seq, 10, k_fn, DefaultV);
    ASSERT_TRUE(ev->Step(nullptr, kStride).ok());
    for (int l = 0; l < kLayers; ++l) {
      for (int h = 0; h < kKv; ++h) {
        ASSERT_EQ(Positions(seq, l, h), (std::vector<int32_t>{0, 1, 6, 7, 8, 9}));
        for (int s = 0; s < 6; ++s) {
          const int pos = seq.position(l, h, s);
          const float want = !merge ? DefaultV(pos, l, h, 0)
                             : pos == 6 || pos == 7
                                 ? (DefaultV(pos, l, h, 0) + DefaultV(pos - 4, l, h, 0)) / 2
                                 : DefaultV(pos, l, h, 0);
          EXPECT_FLOAT_EQ(seq.View().V(l, h, s)[0], want) << merge << " " << pos;
          for (int d = 0; d < kDim; ++d) EXPECT_EQ(seq.View().K(l, h, s)[d], k_fn(pos, l, h, d));
        }
      }
    }
  }
}

}  // namespace
}  // namespace recall::cache::eviction
