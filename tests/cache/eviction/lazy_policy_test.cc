#include "cache/eviction/lazy_policy.h"

#include <algorithm>
#include <vector>

#include "gtest/gtest.h"

namespace recall::cache::eviction {
namespace {

class LazyPolicyTest : public ::testing::Test {
 protected:
  LazyPolicy Make(int window, float alpha) {
    PolicyOptions o;
    o.name = "lazy";
    o.window = window;
    o.alpha = alpha;
    return LazyPolicy(o);
  }
  std::vector<int32_t> Keep(const LazyPolicy& p, const HeadState& s, int budget, int t) {
    SelectContext ctx;
    ctx.scratch = &scratch_;
    std::vector<int32_t> keep;
    p.SelectKeep(s, s.size(), budget, t, ctx, &keep);
    return keep;
  }
  SelectScratch scratch_;
};

// Scenario: S = H1 + H2 for given (t, ts, mri), values computed by hand (Python, double).
TEST_F(LazyPolicyTest, ScoreMatchesHandComputedValues) {
  // Important this very step, never recurred: H1 = 2 / (1 + e), H2 = 0 because mri = 0.
  EXPECT_NEAR(LazyPolicy::Score(10, 10, 0), 0.53788284273999, 1e-12);
  // Never important since it was appended (mri = 0, t > ts): H1 underflows to 0, H2 = 0.
  EXPECT_EQ(LazyPolicy::Score(10, 9, 0), 0.0);
  EXPECT_EQ(LazyPolicy::Score(40, 0, 0), 0.0);
  // t - ts = 6, mri = 3: H1 = 2 / (1 + exp(1 + 6 / 3.00001)) = 0.0948523487104062,
  // H2 = 2 / (1 + exp(2)) = 0.238405844044235.
  EXPECT_NEAR(LazyPolicy::Score(10, 4, 3), 0.333258192754641, 1e-12);
  // mri = 1: H2 = 2 / (1 + exp(0)) = 1.
  EXPECT_NEAR(LazyPolicy::Score(5, 5, 1), 1.53788284273999, 1e-12);
  // Due exactly one MRI ago (t - ts = mri = 32): H1 ~ 2 / (1 + e^2), H2 ~ 6.9e-14.
  EXPECT_NEAR(LazyPolicy::Score(64, 32, 32), 0.238405909665282, 1e-12);
}

// Scenario: alpha = 0.1, 4 slots; importance is p >= alpha (equality counts).
TEST_F(LazyPolicyTest, ObserveUpdatesTsAndMriOfImportantSlotsOnly) {
  LazyPolicy lazy = Make(4, 0.1f);
  HeadState s;
  AppendSlots(&s, 3, 1);  // prompt: ts = 0
  const float p1[3] = {0.5f, 0.05f, 0.1f};
  lazy.Observe(&s, p1, 3, 1);
  EXPECT_EQ(s.ts, (std::vector<int32_t>{1, 0, 1}));
  EXPECT_EQ(s.mri, (std::vector<int32_t>{1, 0, 1}));
  AppendSlots(&s, 1, 2);  // decoded at step 1, seen from step 2: ts = 1
  const float quiet[4] = {0, 0, 0, 0};
  for (int t = 2; t <= 4; ++t) lazy.Observe(&s, quiet, 4, t);
  EXPECT_EQ(s.ts, (std::vector<int32_t>{1, 0, 1, 1}));
  const float p5[4] = {0.9f, 0.9f, 0.0f, 0.2f};
  lazy.Observe(&s, p5, 4, 5);
  EXPECT_EQ(s.ts, (std::vector<int32_t>{5, 5, 1, 5}));
  EXPECT_EQ(s.mri, (std::vector<int32_t>{4, 5, 1, 4}));
  const float p6[4] = {0.9f, 0.0f, 0.0f, 0.0f};
  lazy.Observe(&s, p6, 4, 6);
  EXPECT_EQ(s.mri[0], 4) << "mri is a max: a shorter interval must not lower it";
  EXPECT_EQ(s.ts[0], 6);
}

// Scenario: W = 4. Eviction happens only at multiples of W, and only over budget.
TEST_F(LazyPolicyTest, EvictsOnlyOverBudgetAtMultiplesOfW) {
  LazyPolicy lazy = Make(4, 1e-4f);
  for (int t = 1; t <= 12; ++t) {
    EXPECT_EQ(lazy.ShouldEvict(10, 8, t), t % 4 == 0) << "t=" << t;
    EXPECT_FALSE(lazy.ShouldEvict(8, 8, t)) << "at budget, t=" << t;
  }
}

// Scenario: t = 8, W = 3, C = 6, 10 slots. Slots 7..9 (the last W) have the worst possible
// state (never important) and must still be kept; of slots 0..6 the top 3 by S are kept:
//   slot (ts, mri)  S
//   0    (0, 0)     0
//   1    (8, 0)     0.538  (important now)
//   2    (5, 3)     0.477
//   3    (2, 0)     0
//   4    (6, 1)     1.095
//   5    (7, 0)     0
//   6    (1, 2)     0.560
TEST_F(LazyPolicyTest, KeepsTopCMinusWByScorePlusTheLastW) {
  LazyPolicy lazy = Make(3, 1e-4f);
  HeadState s;
  AppendSlots(&s, 10, 1);
  s.ts = {0, 8, 5, 2, 6, 7, 1, 0, 0, 0};
  s.mri = {0, 0, 3, 0, 1, 0, 2, 0, 0, 0};
  EXPECT_EQ(Keep(lazy, s, 6, 8), (std::vector<int32_t>{1, 4, 6, 7, 8, 9}));
}

// Scenario: 8 slots all with S = 0 (never important), W = 2, C = 5: the tie is broken by
// slot index, the OLDER slots win: keep 0, 1, 2 and the window 6, 7. Twice, same answer.
TEST_F(LazyPolicyTest, TiesKeepTheOlderSlotsDeterministically) {
  LazyPolicy lazy = Make(2, 1e-4f);
  HeadState s;
  AppendSlots(&s, 8, 4);  // ts = 3, mri = 0: S = 0 at t = 10
  const std::vector<int32_t> expected = {0, 1, 2, 6, 7};
  EXPECT_EQ(Keep(lazy, s, 5, 10), expected);
  EXPECT_EQ(Keep(lazy, s, 5, 10), expected);
  // Equal non-zero scores too: slots 3 and 5 both (ts 9, mri 1), only one place left.
  s.ts[3] = s.ts[5] = 9;
  s.mri[3] = s.mri[5] = 1;
  s.ts[0] = 10;  // S = 0.538
  s.mri[0] = 0;
  EXPECT_EQ(Keep(lazy, s, 4, 10), (std::vector<int32_t>{3, 5, 6, 7}));
  EXPECT_EQ(Keep(lazy, s, 3, 10), (std::vector<int32_t>{3, 6, 7}));
}

// Scenario: prompt of 10 slots, C = 8, W = 4, 40 decode steps appending one slot each with
// pseudo-random probabilities. The prompt is not compressed at prefill, so the first
// eviction (t = 4) comes from 10 + 4 = 14 slots. After that the length climbs from C to
// C + W and every eviction (every W steps) brings it back to exactly C.
TEST_F(LazyPolicyTest, LengthPeaksAtCPlusWAndIsExactlyCAfterEachEviction) {
  constexpr int kC = 8, kW = 4;
  LazyPolicy lazy = Make(kW, 0.05f);
  HeadState s;
  int len = 10;
  int peak_after_first = 0, evictions = 0;
  uint32_t rng = 7;
  std::vector<float> p;
  for (int t = 1; t <= 40; ++t) {
    ++len;  // the token decoded at step t - 1 (or the prompt at t = 1) is now in the cache
    AppendSlots(&s, len - s.size(), t);
    p.resize(len);
    for (float& x : p) {
      rng = rng * 1664525u + 1013904223u;
      x = static_cast<float>(rng >> 8) / static_cast<float>(1u << 24) * 0.1f;
    }
    lazy.Observe(&s, p.data(), len, t);
    if (evictions > 0) peak_after_first = std::max(peak_after_first, len);
    if (t == 4) {
      EXPECT_EQ(len, 14);
    }
    if (!lazy.ShouldEvict(len, kC, t)) {
      EXPECT_FALSE(t % kW == 0 && len > kC);
      continue;
    }
    EXPECT_EQ(t % kW, 0);
    std::vector<int32_t> keep = Keep(lazy, s, kC, t);
    ASSERT_EQ(static_cast<int>(keep.size()), kC);
    for (int j = len - kW; j < len; ++j) {
      EXPECT_TRUE(std::binary_search(keep.begin(), keep.end(), j)) << "window slot " << j;
    }
    CompactState(&s, keep);
    len = s.size();
    EXPECT_EQ(len, kC);
    ++evictions;
  }
  EXPECT_EQ(evictions, 10);
  EXPECT_EQ(peak_after_first, kC + kW);
}

}  // namespace
}  // namespace recall::cache::eviction
