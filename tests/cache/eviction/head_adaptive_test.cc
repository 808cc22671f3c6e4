#include "cache/eviction/head_adaptive.h"

#include <random>
#include <vector>

#include "cache/eviction/budget.h"
#include "gtest/gtest.h"

namespace recall::cache::eviction {
namespace {

// A candidate set over slots [0, scores.size()) plus always-kept slots `always` after them.
CandidateSet Head(const std::vector<double>& scores, const std::vector<int32_t>& always) {
  CandidateSet c;
  c.always = always;
  c.begin = 0;
  c.end = static_cast<int>(scores.size());
  c.score = scores;
  c.captured = true;
  return c;
}

std::vector<std::vector<int32_t>> Select(const std::vector<CandidateSet>& heads, int budget,
                                         double safeguard) {
  HeadAdaptiveScratch scratch;
  std::vector<std::vector<int32_t>> keeps;
  SelectHeadAdaptive(heads.data(), static_cast<int>(heads.size()), budget, safeguard, &scratch,
                     &keeps);
  return keeps;
}

// Scenario: 2 heads of 10 slots, window {8, 9} always kept, C = 5, so each head's quota is 3
// and the layer keeps 2 * 5 = 10 slots. Head 0 is focused (one slot at 0.90), head 1 spread.
//   head 0: .90 .02 .02 .02 .02 .02 .01 .01
//   head 1: .15 .14 .13 .12 .11 .10 .09 .08
// Safeguard 0 (and 0.2: floor(0.2 * 3) = 0): the global top 6 is h0:0 and h1:0..4, so head 0
// keeps 3 slots and head 1 keeps 7. Safeguard 0.67 (floor(2.01) = 2 per head): h0 keeps 0 and
// 1 (the older of the .02 ties), h1 keeps 0, 1, and the global rest is h1:2, h1:3.
// Safeguard 1 is uniform mode: 3 candidates per head.
TEST(HeadAdaptiveTest, GlobalTopKAcrossHeadsWithSafeguard) {
  const std::vector<int32_t> window = {8, 9};
  const std::vector<CandidateSet> heads = {Head({.90, .02, .02, .02, .02, .02, .01, .01}, window),
                                           Head({.15, .14, .13, .12, .11, .10, .09, .08}, window)};
  for (double sg : {0.0, 0.2}) {
    const std::vector<std::vector<int32_t>> k = Select(heads, 5, sg);
    EXPECT_EQ(k[0], (std::vector<int32_t>{0, 8, 9})) << sg;
    EXPECT_EQ(k[1], (std::vector<int32_t>{0, 1, 2, 3, 4, 8, 9})) << sg;
  }
  std::vector<std::vector<int32_t>> k = Select(heads, 5, 0.67);
  EXPECT_EQ(k[0], (std::vector<int32_t>{0, 1, 8, 9}));
  EXPECT_EQ(k[1], (std::vector<int32_t>{0, 1, 2, 3, 8, 9}));
  k = Select(heads, 5, 1.0);
  EXPECT_EQ(k[0], (std::vector<int32_t>{0, 1, 2, 8, 9}));
  EXPECT_EQ(k[1], (std::vector<int32_t>{0, 1, 2, 8, 9}));
}

// Scenario: all six scores equal, C = 2, no always-kept slots: the 4 kept go by head, then
// slot: head 0 keeps 0, 1, 2 and head 1 keeps 0. A head with fewer candidates than its quota
// leaves the rest to the others, and a layer with fewer slots than H * C keeps everything.
TEST(HeadAdaptiveTest, TiesGoToTheLowerHeadThenTheOlderSlotAndShortHeadsLendTheirQuota) {
  std::vector<std::vector<int32_t>> k =
      Select({Head({.5, .5, .5}, {}), Head({.5, .5, .5}, {})}, 2, 0.0);
  EXPECT_EQ(k[0], (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(k[1], (std::vector<int32_t>{0}));

  // Head 0 has 1 candidate (quota 3), head 1 has 5: 6 kept in total.
  k = Select({Head({.1}, {}), Head({.5, .4, .3, .2, .6}, {})}, 3, 0.2);
  EXPECT_EQ(k[0], (std::vector<int32_t>{0}));
  EXPECT_EQ(k[1], (std::vector<int32_t>{0, 1, 2, 3, 4}));

  k = Select({Head({.1, .2}, {2}), Head({.5}, {1})}, 4, 0.2);
  EXPECT_EQ(k[0], (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(k[1], (std::vector<int32_t>{0, 1}));
}

// Scenario: value protection 0.5 with C = 4: each head first keeps its floor(0.5 * 4) = 2
// candidates of largest value range (head 0: 4, 5; head 1: 5, then the older of the 0-range
// ties, 0), then the global rest by score (h1: 1..4, all above head 0's .01).
TEST(HeadAdaptiveTest, ValueProtectionIsPerHeadBeforeTheGlobalSelection) {
  CandidateSet h0 = Head({.01, .01, .01, .01, .01, .01}, {});
  h0.value_protection = 0.5f;
  h0.value_range = {0, 0, 0, 0, 9, 9};
  CandidateSet h1 = Head({.5, .4, .3, .2, .1, .05}, {});
  h1.value_protection = 0.5f;
  h1.value_range = {0, 0, 0, 0, 0, 9};
  const std::vector<std::vector<int32_t>> k = Select({h0, h1}, 4, 0.0);
  EXPECT_EQ(k[0], (std::vector<int32_t>{4, 5}));
  EXPECT_EQ(k[1], (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
}

// Scenario: with one head the global selection is uniform mode: same keep list as
// SelectUniform for random scores and value ranges (ties included), every budget.
TEST(HeadAdaptiveTest, OneHeadIsUniformMode) {
  std::mt19937 rng(99);
  for (int trial = 0; trial < 20; ++trial) {
    CandidateSet c;
    c.begin = 2;
    c.end = 20;
    c.always = {0, 1, 20, 21};
    c.score.resize(20);
    c.value_range.resize(20);
    for (double& s : c.score) s = static_cast<double>(rng() % 4);
    for (float& v : c.value_range) v = static_cast<float>(rng() % 3);
    c.value_protection = trial % 2 == 0 ? 0.0f : 0.3f;
    for (int budget = 4; budget <= 24; ++budget) {
      SelectScratch scratch;
      std::vector<int32_t> uniform;
      SelectUniform(c, budget, &scratch, &uniform);
      for (double sg : {0.0, 0.2, 1.0}) {
        EXPECT_EQ(Select({c}, budget, sg)[0], uniform) << trial << " " << budget << " " << sg;
      }
    }
  }
}

TEST(HeadAdaptiveTest, SafeguardOutOfRangeIsInvalidArgument) {
  BudgetOptions o;
  o.head_adaptive = true;
  o.head_safeguard = 1.5;
  absl::StatusOr<BudgetAllocator> a = BudgetAllocator::Create(o, 2);
  ASSERT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(a.status().message().find("head_safeguard"), absl::string_view::npos);
  o.head_safeguard = 0.2;
  EXPECT_TRUE(BudgetAllocator::Create(o, 2).ok());
}

}  // namespace
}  // namespace recall::cache::eviction
