#include "cache/eviction/h2o_policy.h"

#include <vector>

#include "gtest/gtest.h"

namespace recall::cache::eviction {
namespace {

// Scenario: W = 2, C = 5, 8 slots observed over 3 steps. Accumulated attention of slots
// 0..5 (the candidates; 6, 7 are the recent window):
//   slot:  0    1    2    3    4    5
//   acc:  0.9  0.1  0.6  0.3  0.6  0.05
// Keep top C - W = 3: slot 0 (0.9), then 2 and 4 tie at 0.6 and both fit -> {0, 2, 4, 6, 7}.
// With C = 4 only two fit: 0 and the OLDER of the tie, 2 -> {0, 2, 6, 7}.
TEST(H2oPolicyTest, KeepsRecentWindowPlusHeaviestAccumulatedSlots) {
  PolicyOptions o;
  o.name = "h2o";
  o.window = 2;
  H2oPolicy h2o(o);
  HeadState s;
  AppendSlots(&s, 8, 1);
  const float p1[8] = {0.5f, 0.0f, 0.25f, 0.0f, 0.5f, 0.0f, 0.0f, 0.0f};
  const float p2[8] = {0.25f, 0.1f, 0.25f, 0.25f, 0.0f, 0.0f, 0.0f, 0.0f};
  const float p3[8] = {0.15f, 0.0f, 0.1f, 0.05f, 0.1f, 0.05f, 0.0f, 0.0f};
  h2o.Observe(&s, p1, 8, 1);
  h2o.Observe(&s, p2, 8, 2);
  h2o.Observe(&s, p3, 8, 3);
  EXPECT_FLOAT_EQ(s.score[0], 0.9f);
  EXPECT_FLOAT_EQ(s.score[2], 0.6f);
  EXPECT_FLOAT_EQ(s.score[4], 0.6f);
  EXPECT_EQ(s.score[2], s.score[4]) << "the tie below relies on exactly equal sums";
  EXPECT_TRUE(h2o.ShouldEvict(8, 5, 3));
  EXPECT_FALSE(h2o.ShouldEvict(5, 5, 3));
  SelectScratch scratch;
  SelectContext ctx;
  ctx.scratch = &scratch;
  std::vector<int32_t> keep;
  h2o.SelectKeep(s, 8, 5, 3, ctx, &keep);
  EXPECT_EQ(keep, (std::vector<int32_t>{0, 2, 4, 6, 7}));
  h2o.SelectKeep(s, 8, 4, 3, ctx, &keep);
  EXPECT_EQ(keep, (std::vector<int32_t>{0, 2, 6, 7}));
  // Scores travel with their slots.
  CompactState(&s, keep);
  EXPECT_FLOAT_EQ(s.score[0], 0.9f);
  EXPECT_FLOAT_EQ(s.score[1], 0.6f);
}

}  // namespace
}  // namespace recall::cache::eviction
