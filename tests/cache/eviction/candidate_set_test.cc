#include "cache/eviction/candidate_set.h"

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace recall::cache::eviction {
namespace {

PolicyOptions Options(const std::string& name, float value_protection) {
  PolicyOptions o;
  o.name = name;
  o.window = 4;
  o.sinks = 2;
  o.interval = 8;
  o.query_window = 3;
  o.value_protection = value_protection;
  o.seed = 7;
  return o;
}

// A state of `len` slots with coarse random values (many ties) at step t.
HeadState RandomState(int len, int t, std::mt19937* rng) {
  HeadState s;
  AppendSlots(&s, len, 1);
  for (int j = 0; j < len; ++j) {
    s.ts[static_cast<size_t>(j)] = static_cast<int32_t>((*rng)() % static_cast<uint32_t>(t));
    s.mri[static_cast<size_t>(j)] = static_cast<int32_t>((*rng)() % 6);
    s.score[static_cast<size_t>(j)] = static_cast<float>((*rng)() % 5) * 0.25f;
  }
  return s;
}

// Scenario: for every policy, with and without value protection, for every budget from
// min_budget() to beyond the length, scoring mode followed by SelectUniform keeps exactly the
// slots SelectKeep keeps (scores with many ties, value ranges with ties, random keys).
TEST(CandidateSetTest, ScoreThenSelectUniformReproducesSelectKeepForEveryPolicy) {
  constexpr int kLen = 30, kDim = 4, kT = 16;
  std::mt19937 rng(1234);
  for (const std::string& name : PolicyNames()) {
    for (float vp : {0.0f, 0.25f}) {
      absl::StatusOr<std::unique_ptr<EvictionPolicy>> policy = CreatePolicy(Options(name, vp));
      ASSERT_TRUE(policy.ok()) << policy.status();
      const HeadState state = RandomState(kLen, kT, &rng);
      std::vector<float> value_range(kLen), keys(static_cast<size_t>(kLen) * kDim);
      for (float& v : value_range) v = static_cast<float>(rng() % 4);
      for (float& k : keys) k = static_cast<float>(static_cast<int>(rng() % 7) - 3);
      SelectScratch scratch;
      SelectContext ctx;
      ctx.scratch = &scratch;
      ctx.value_range = value_range.data();
      ctx.keys = keys.data();
      ctx.head_dim = kDim;
      ctx.session = 3;
      ctx.layer = 1;
      ctx.head = 2;
      CandidateSet c;
      ScoreCandidates(**policy, state, kLen, kT, ctx, &c);
      for (int budget = (*policy)->min_budget(); budget <= kLen + 2; ++budget) {
        std::vector<int32_t> expected, got;
        (*policy)->SelectKeep(state, kLen, budget, kT, ctx, &expected);
        SelectUniform(c, budget, &scratch, &got);
        EXPECT_EQ(got, expected) << name << " vp=" << vp << " budget=" << budget;
      }
    }
  }
}

// Scenario: H2O with W = 4 over 10 slots: the window 6..9 is always kept, the candidates are
// 0..5 with the accumulated attention as score; no value ranges are captured without value
// protection. FullKV keeps everything and captures no candidates.
TEST(CandidateSetTest, ScoringModeSplitsAlwaysKeptSlotsFromScoredCandidates) {
  PolicyOptions o = Options("h2o", 0.0f);
  absl::StatusOr<std::unique_ptr<EvictionPolicy>> h2o = CreatePolicy(o);
  ASSERT_TRUE(h2o.ok());
  HeadState s;
  AppendSlots(&s, 10, 1);
  for (int j = 0; j < 10; ++j) s.score[static_cast<size_t>(j)] = 0.1f * j;
  SelectScratch scratch;
  SelectContext ctx;
  ctx.scratch = &scratch;
  CandidateSet c;
  ScoreCandidates(**h2o, s, 10, 3, ctx, &c);
  EXPECT_TRUE(c.captured);
  EXPECT_EQ(c.always, (std::vector<int32_t>{6, 7, 8, 9}));
  EXPECT_EQ(c.begin, 0);
  EXPECT_EQ(c.end, 6);
  for (int j = 0; j < 6; ++j) EXPECT_FLOAT_EQ(c.score[static_cast<size_t>(j)], 0.1f * j);
  EXPECT_EQ(c.value_protection, 0.0f);
  EXPECT_EQ(c.quota(7), 3);
  EXPECT_EQ(c.quota(3), 0);

  // Short head: everything is always kept.
  ScoreCandidates(**h2o, s, 4, 3, ctx, &c);
  EXPECT_EQ(c.num_candidates(), 0);
  EXPECT_EQ(c.always, (std::vector<int32_t>{0, 1, 2, 3}));

  o.name = "full";
  absl::StatusOr<std::unique_ptr<EvictionPolicy>> full = CreatePolicy(o);
  ASSERT_TRUE(full.ok());
  ScoreCandidates(**full, s, 10, 3, ctx, &c);
  EXPECT_FALSE(c.captured);
  EXPECT_EQ(c.num_candidates(), 0);
  EXPECT_EQ(c.always.size(), 10u);
}

}  // namespace
}  // namespace recall::cache::eviction
