// MergeEvicted (cache/eviction/merge.h): evicted slots merged into the kept slot of the most
// similar key, weighted, only above the similarity threshold.
#include "cache/eviction/merge.h"

#include <vector>

#include "gtest/gtest.h"

namespace recall::cache::eviction {
namespace {

constexpr int kDim = 2;

// Keys: slot 0 along x, slot 1 along y, slot 2 near x (cos 0.8), slot 3 near y (cos 0.6),
// slot 4 along -x (cos -1 to slot 0). Values: slot s = (s + 1, 10 (s + 1)).
struct Rows {
  std::vector<float> keys = {1, 0, 0, 1, 0.8f, 0.6f, 0.8f, 0.6f, -1, 0};
  std::vector<float> values = {1, 10, 2, 20, 3, 30, 4, 40, 5, 50};
};

TEST(MergeEvictedTest, EachEvictedSlotGoesToItsMostSimilarKeptKeyByWeight) {
  Rows r;
  // Slot 3's key is (0.8, 0.6) too: nearer x (0.8) than y (0.6), so it also goes to slot 0.
  const std::vector<double> w = {0.5, 0.2, 0.25, 0.25, 0.1};
  MergeScratch scratch;
  const int merged = MergeEvicted({0.5f, false}, w.data(), 5, {0, 1}, kDim, r.keys.data(),
                                  r.values.data(), &scratch);
  // Slot 4 (cos -1 with slot 0, 0 with slot 1) is under the threshold: dropped, not merged.
  EXPECT_EQ(merged, 2);
  // v_0 = (0.5 * 1 + 0.25 * 3 + 0.25 * 4) / 1.0.
  EXPECT_NEAR(r.values[0], 2.25f, 1e-6f);
  EXPECT_NEAR(r.values[1], 22.5f, 1e-5f);
  // Slot 1 received nothing; keys are unchanged without merge_keys.
  EXPECT_EQ(r.values[2], 2.0f);
  EXPECT_EQ(r.values[3], 20.0f);
  EXPECT_EQ(r.keys, Rows().keys);
}

TEST(MergeEvictedTest, KeysMoveTooWhenAskedAndEqualWeightsWithoutAttention) {
  Rows r;
  MergeScratch scratch;
  EXPECT_EQ(MergeEvicted({0.7f, true}, nullptr, 5, {0, 1}, kDim, r.keys.data(), r.values.data(),
                         &scratch),
            2);
  // Equal weights: slot 0 is the mean of slots 0, 2 and 3.
  EXPECT_NEAR(r.values[0], (1 + 3 + 4) / 3.0f, 1e-6f);
  EXPECT_NEAR(r.keys[0], (1 + 0.8f + 0.8f) / 3.0f, 1e-6f);
  EXPECT_NEAR(r.keys[1], (0 + 0.6f + 0.6f) / 3.0f, 1e-6f);
  EXPECT_EQ(r.keys[2], 0.0f);
  EXPECT_EQ(r.keys[3], 1.0f);
}

TEST(MergeEvictedTest, AThresholdAboveEverySimilarityMergesNothing) {
  Rows r;
  MergeScratch scratch;
  EXPECT_EQ(MergeEvicted({0.9f, true}, nullptr, 5, {0, 1}, kDim, r.keys.data(), r.values.data(),
                         &scratch),
            0);
  EXPECT_EQ(r.values, Rows().values);
  EXPECT_EQ(r.keys, Rows().keys);
}

TEST(MergeEvictedTest, ZeroKeysAndZeroWeightsMergeNowhere) {
  std::vector<float> keys = {1, 0, 0, 0, 1, 0};
  std::vector<float> values = {1, 1, 7, 7, 9, 9};
  const std::vector<double> w = {0.0, 0.5, 0.0};
  MergeScratch scratch;
  // Slot 1's key is zero (no direction); slot 2 has weight 0: nothing moves.
  EXPECT_EQ(
      MergeEvicted({0.0f, false}, w.data(), 3, {0}, kDim, keys.data(), values.data(), &scratch), 0);
  EXPECT_EQ(values[0], 1.0f);
}

}  // namespace
}  // namespace recall::cache::eviction
