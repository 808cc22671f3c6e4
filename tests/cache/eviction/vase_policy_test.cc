#include "cache/eviction/vase_policy.h"

#include <algorithm>
#include <memory>
#include <numeric>
#include <set>
#include <vector>

#include "cache/block_pool.h"
#include "cache/eviction/session_evictor.h"
#include "cache/sequence_cache.h"
#include "gtest/gtest.h"

namespace recall::cache::eviction {
namespace {

class VasePolicyTest : public ::testing::Test {
 protected:
  static PolicyOptions Options(int window, int sinks, float value_protection, uint64_t seed) {
    PolicyOptions o;
    o.name = "vase";
    o.window = window;
    o.sinks = sinks;
    o.value_protection = value_protection;
    o.seed = seed;
    return o;
  }

  // A state of `len` prompt slots that observed `p` once at step 1.
  static HeadState Observed(const VasePolicy& policy, const std::vector<float>& p) {
    HeadState s;
    const int len = static_cast<int>(p.size());
    AppendSlots(&s, len, 1);
    policy.Observe(&s, p.data(), len, 1);
    return s;
  }

  std::vector<int32_t> Select(const VasePolicy& policy, const HeadState& s, int budget, int t,
                              const std::vector<float>& value_range, uint64_t session = 0,
                              int64_t eviction_count = 0) {
    SelectContext ctx;
    ctx.scratch = &scratch_;
    ctx.value_range = value_range.data();
    ctx.session = session;
    ctx.eviction_count = eviction_count;
    std::vector<int32_t> keep;
    policy.SelectKeep(s, s.size(), budget, t, ctx, &keep);
    return keep;
  }

  SelectScratch scratch_;
};

// Scenario: W = 4. Observe sums the attention of the steps of the current window and
// restarts at steps 1, 5, 9, ...; eviction is considered only at t % 4 == 0 and len > C.
TEST_F(VasePolicyTest, WindowSumRestartsEveryWStepsAndEvictionIsLagged) {
  VasePolicy vase(Options(4, 4, 0.0f, 0));
  HeadState s;
  AppendSlots(&s, 2, 1);
  const float p[2] = {0.25f, 0.5f};
  for (int t = 1; t <= 4; ++t) vase.Observe(&s, p, 2, t);
  EXPECT_EQ(s.score, (std::vector<float>{1.0f, 2.0f}));
  vase.Observe(&s, p, 2, 5);
  EXPECT_EQ(s.score, (std::vector<float>{0.25f, 0.5f}));
  for (int t = 1; t <= 12; ++t) EXPECT_EQ(vase.ShouldEvict(20, 8, t), t % 4 == 0) << t;
  EXPECT_FALSE(vase.ShouldEvict(8, 8, 8));
  EXPECT_EQ(vase.min_budget(), 5);
  EXPECT_TRUE(vase.needs_value_range());
}

// Scenario: 64 slots, C = 16, 4 sinks, quota floor(0.25 * 16) = 4: slots 10, 20, 30, 40 have
// the largest value ranges and no attention, the attention sits on slots 50..63. Over 200
// seeds the keep set always holds the sinks and the 4 value slots, exactly 16 ascending
// slots, and the other 8 only among attended slots (or their pooling neighbours 48, 49).
TEST_F(VasePolicyTest, SinksAndTopValueRangeQuotaAreAlwaysKept) {
  VasePolicy vase(Options(1, 4, 0.0f, 0));
  std::vector<float> p(64, 0.0f), vr(64, 1.0f);
  for (int j = 50; j < 64; ++j) p[j] = 1.0f / 14;
  for (int j : {10, 20, 30, 40}) vr[j] = 100.0f + j;
  const HeadState s = Observed(vase, p);
  for (uint64_t seed = 0; seed < 200; ++seed) {
    const std::vector<int32_t> keep = Select(vase, s, 16, 1, vr, seed);
    ASSERT_EQ(keep.size(), 16u);
    EXPECT_TRUE(std::is_sorted(keep.begin(), keep.end()));
    const std::set<int32_t> k(keep.begin(), keep.end());
    EXPECT_EQ(k.size(), 16u);
    for (int j : {0, 1, 2, 3, 10, 20, 30, 40})
      EXPECT_EQ(k.count(j), 1u) << "seed " << seed << " slot " << j;
    for (int32_t j : keep) {
      if (j < 4 || j % 10 == 0) continue;
      EXPECT_GE(j, 48) << "sampled a slot of zero pooled attention, seed " << seed;
    }
  }
}

// Scenario: uniform attention (every candidate ties). The same seed context gives the same
// keep set twice; a different PolicyOptions::seed, session or eviction count gives another.
TEST_F(VasePolicyTest, SameSeedSameKeepSetDifferentSeedDifferentKeepSet) {
  std::vector<float> p(128, 1.0f / 128), vr(128, 1.0f);
  VasePolicy a(Options(1, 4, 0.0f, 7)), b(Options(1, 4, 0.0f, 8));
  const HeadState s = Observed(a, p);
  const std::vector<int32_t> base = Select(a, s, 32, 1, vr, 3, 5);
  EXPECT_EQ(Select(a, s, 32, 1, vr, 3, 5), base);
  EXPECT_NE(Select(b, s, 32, 1, vr, 3, 5), base) << "seed";
  EXPECT_NE(Select(a, s, 32, 1, vr, 4, 5), base) << "session";
  EXPECT_NE(Select(a, s, 32, 1, vr, 3, 6), base) << "eviction count";
}

// Scenario: sinks = 0, C = 1 and a quota of floor(0.01 * 1) = 0: one slot is drawn from 10
// with probability proportional to the avg-pooled (kernel 5, / 5) attention. Over 20000
// seeds every slot's frequency is within 0.015 of w_j / sum(w).
TEST_F(VasePolicyTest, SamplingFrequencyIsProportionalToPooledAttention) {
  const std::vector<float> p = {0.4f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.1f, 0.0f, 0.5f};
  std::vector<double> w(10, 0.0);
  for (int j = 0; j < 10; ++j) {
    for (int i = std::max(0, j - 2); i <= std::min(9, j + 2); ++i) w[j] += p[i] / 5.0;
  }
  const double total = std::accumulate(w.begin(), w.end(), 0.0);
  std::vector<float> vr(10, 1.0f);
  std::vector<int> count(10, 0);
  const int kTrials = 20000;
  for (int seed = 0; seed < kTrials; ++seed) {
    VasePolicy vase(Options(1, 0, 0.01f, static_cast<uint64_t>(seed)));
    const HeadState s = Observed(vase, p);
    const std::vector<int32_t> keep = Select(vase, s, 1, 1, vr);
    ASSERT_EQ(keep.size(), 1u);
    ++count[keep[0]];
  }
  for (int j = 0; j < 10; ++j) {
    EXPECT_NEAR(static_cast<double>(count[j]) / kTrials, w[j] / total, 0.015) << "slot " << j;
  }
  EXPECT_EQ(count[4], 0) << "slot 4's pooling window [2, 6] holds no attention";
}

// Scenario: the mean divides by the number of window queries that saw the slot. W = 4,
// slot 1 (a prompt slot) gets 0.1 at each of steps 1..4 (mean 0.1); slot 5, appended before
// step 4, gets 0.3 once (mean 0.3). With sinks = 0, C = 1 and no quota the pooled weights
// (x 5) are 0.1 for slots 0..2, 0.4 for slot 3 (both windows), 0.3 for slots 4, 5: over 4000
// seeds slot 4 or 5 is drawn 0.6 / 1.3 of the time (0.15 / 0.625 = 0.24 had the mean been divided
// by W).
TEST_F(VasePolicyTest, MeanCountsOnlyTheQueriesThatSawTheSlot) {
  std::vector<float> vr(6, 1.0f);
  int newer = 0;
  const int kTrials = 4000;
  for (int seed = 0; seed < kTrials; ++seed) {
    VasePolicy vase(Options(4, 0, 0.01f, static_cast<uint64_t>(seed)));
    HeadState s;
    AppendSlots(&s, 5, 1);
    const float p5[5] = {0.0f, 0.1f, 0.0f, 0.0f, 0.0f};
    for (int t = 1; t <= 3; ++t) vase.Observe(&s, p5, 5, t);
    AppendSlots(&s, 1, 4);
    const float p6[6] = {0.0f, 0.1f, 0.0f, 0.0f, 0.0f, 0.3f};
    vase.Observe(&s, p6, 6, 4);
    const std::vector<int32_t> keep = Select(vase, s, 1, 4, vr);
    ASSERT_EQ(keep.size(), 1u);
    if (keep[0] >= 4) ++newer;
  }
  EXPECT_NEAR(static_cast<double>(newer) / kTrials, 0.6 / 1.3, 0.03);
}

TEST(VaseSessionTest, EvictorSuppliesValueRangesAndSeedsReproducibly) {
  const kernels::PagedKvLayout layout{2, 2, 4, 4};
  auto pool = BlockPool::Create(layout, 128);
  ASSERT_TRUE(pool.ok());
  // Runs 40 decode steps after a 30-token prompt with uniform attention, W = 8, C = 16;
  // position 7's V row has a huge range. Returns kept positions of every (layer, head).
  auto run = [&](uint64_t session) {
    SequenceCache seq(pool->get());
    SessionEvictorOptions o;
    o.policy.name = "vase";
    o.policy.window = 8;
    o.budget.budget = 16;
    o.n_heads = 4;
    o.session = session;
    auto ev = SessionEvictor::Create(o, &seq);
    EXPECT_TRUE(ev.ok()) << ev.status();
    std::vector<std::vector<int32_t>> kept;
    auto append = [&](int n) {
      ASSERT_TRUE(seq.Reserve(n).ok());
      std::vector<int32_t> pos(static_cast<size_t>(n));
      std::iota(pos.begin(), pos.end(), seq.next_position());
      for (int l = 0; l < 2; ++l) {
        for (int h = 0; h < 2; ++h) {
          for (int i = 0; i < n; ++i) {
            float* v = seq.View().V(l, h, seq.length(l, h) + i);
            for (int d = 0; d < 4; ++d) v[d] = pos[i] == 7 && d == 0 ? 1e6f : 0.0f;
          }
        }
      }
      seq.CommitAppend(pos.data(), n);
    };
    append(30);
    const int64_t stride = 128;
    std::vector<float> probs(2 * 4 * stride);
    for (int t = 1; t <= 40; ++t) {
      append(1);
      for (int l = 0; l < 2; ++l) {
        for (int qh = 0; qh < 4; ++qh) {
          const int len = seq.length(l, qh / 2);
          for (int s = 0; s < len; ++s) probs[(l * 4 + qh) * stride + s] = 1.0f / len;
        }
      }
      EXPECT_TRUE((*ev)->Step(probs.data(), stride).ok());
      for (int l = 0; l < 2; ++l) {
        for (int h = 0; h < 2; ++h) {
          EXPECT_EQ(seq.length(l, h), t < 8 ? 30 + t : (t % 8 == 0 ? 16 : 16 + t % 8)) << t;
        }
      }
    }
    for (int l = 0; l < 2; ++l) {
      for (int h = 0; h < 2; ++h) {
        std::vector<int32_t> k;
        for (int s = 0; s < seq.length(l, h); ++s) k.push_back(seq.position(l, h, s));
        EXPECT_EQ(std::vector<int32_t>(k.begin(), k.begin() + 4),
                  (std::vector<int32_t>{0, 1, 2, 3}));
        EXPECT_NE(std::find(k.begin(), k.end(), 7), k.end()) << "largest value range kept";
        kept.push_back(k);
      }
    }
    return kept;
  };
  const auto a = run(1), b = run(1), c = run(2);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_NE(a[0], a[1]) << "heads are seeded separately";
}

}  // namespace
}  // namespace recall::cache::eviction
