#include "cache/eviction/tova_policy.h"

#include <vector>

#include "gtest/gtest.h"

namespace recall::cache::eviction {
namespace {

// Scenario: one layer, 2 query heads, 6 slots, C = 4. TOVA scores are the last query's
// attention averaged over the layer's heads: mean = {0.3, 0.05, 0.2, 0.1, 0.05, 0.3}.
// Two slots must go: the lowest is 0.05, shared by slots 1 and 4 -> both dropped.
// With C = 5 one slot goes: the tie 1 vs 4 drops the NEWER slot (4).
TEST(TovaPolicyTest, DropsLowestLayerAveragedLastQueryAttention) {
  PolicyOptions o;
  o.name = "tova";
  TovaPolicy tova(o);
  EXPECT_TRUE(tova.layer_shared());
  const float probs[2 * 6] = {0.5f, 0.1f, 0.1f, 0.2f, 0.0f, 0.1f,  //
                              0.1f, 0.0f, 0.3f, 0.0f, 0.1f, 0.5f};
  float mean[6];
  AverageOverHeads(probs, 2, 6, 6, mean);
  HeadState s;
  AppendSlots(&s, 6, 1);
  tova.Observe(&s, mean, 6, 1);
  EXPECT_FLOAT_EQ(s.score[1], 0.05f);
  EXPECT_EQ(s.score[1], s.score[4]);
  EXPECT_TRUE(tova.ShouldEvict(5, 4, 1)) << "evicts at every step over budget";
  SelectScratch scratch;
  SelectContext ctx;
  ctx.scratch = &scratch;
  std::vector<int32_t> keep;
  tova.SelectKeep(s, 6, 4, 1, ctx, &keep);
  EXPECT_EQ(keep, (std::vector<int32_t>{0, 2, 3, 5}));
  tova.SelectKeep(s, 6, 5, 1, ctx, &keep);
  EXPECT_EQ(keep, (std::vector<int32_t>{0, 1, 2, 3, 5}));
  // Observe overwrites (last query only), it does not accumulate.
  const float next[6] = {0.0f, 1.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  tova.Observe(&s, next, 6, 2);
  EXPECT_EQ(s.score[0], 0.0f);
  EXPECT_EQ(s.score[1], 1.0f);
}

}  // namespace
}  // namespace recall::cache::eviction
