#include "cache/eviction/streaming_policy.h"

#include <vector>

#include "gtest/gtest.h"

namespace recall::cache::eviction {
namespace {

std::vector<int32_t> Keep(const EvictionPolicy& p, int len, int budget,
                          const float* value_range = nullptr) {
  HeadState s;
  AppendSlots(&s, len, 1);
  SelectScratch scratch;
  SelectContext ctx;
  ctx.scratch = &scratch;
  ctx.value_range = value_range;
  std::vector<int32_t> keep;
  p.SelectKeep(s, len, budget, 1, ctx, &keep);
  return keep;
}

// Scenario: 2 sinks, C = 6, 10 slots: keep the sinks 0, 1 and the last C - 2 = 4 slots.
TEST(StreamingPolicyTest, KeepsSinksAndMostRecent) {
  PolicyOptions o;
  o.name = "streaming";
  o.sinks = 2;
  StreamingPolicy streaming(o);
  EXPECT_TRUE(streaming.ShouldEvict(7, 6, 3)) << "evicts at every step over budget";
  EXPECT_FALSE(streaming.ShouldEvict(6, 6, 3));
  EXPECT_EQ(Keep(streaming, 10, 6), (std::vector<int32_t>{0, 1, 6, 7, 8, 9}));
  // Default: 4 sinks + C - 4 recent.
  StreamingPolicy def(PolicyOptions{});
  EXPECT_EQ(Keep(def, 12, 7), (std::vector<int32_t>{0, 1, 2, 3, 9, 10, 11}));
}

// Scenario: value protection 0.34 of C = 6 -> floor(2.04) = 2 protected slots. Slots 3 and
// 4 have the largest value ranges (slot 0 is larger still, but it is a sink, kept anyway and
// not a candidate); they take 2 of the 4 non-sink places, the rest stays recency (8, 9).
TEST(StreamingPolicyTest, ValueProtectionKeepsLargestValueRangeSlots) {
  PolicyOptions o;
  o.name = "streaming";
  o.sinks = 2;
  o.value_protection = 0.34f;
  StreamingPolicy streaming(o);
  const float range[10] = {50, 1, 1, 9, 8, 1, 1, 1, 1, 1};
  EXPECT_EQ(Keep(streaming, 10, 6, range), (std::vector<int32_t>{0, 1, 3, 4, 8, 9}));
  // Without value ranges the option has no effect.
  EXPECT_EQ(Keep(streaming, 10, 6), (std::vector<int32_t>{0, 1, 6, 7, 8, 9}));
}

}  // namespace
}  // namespace recall::cache::eviction
