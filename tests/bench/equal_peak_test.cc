// EqualPeak: policies are read at equal peak memory by linear interpolation over their budget
// sweep, never extrapolated; a policy that never evicted says so; FullKV is left out.
#include "bench/quality/equal_peak.h"

#include "gtest/gtest.h"

namespace recall::bench {
namespace {

// A configuration whose runs held `peak` of the full bytes on average, with `top1` agreement
// and mean KL `kl` over 1000 positions.
QualityStats Stats(double peak, double top1, double kl, int64_t evicted_slots = 10) {
  QualityStats s;
  s.positions = 1000;
  s.top1_agree = static_cast<int64_t>(top1 * 1000);
  s.kl_sum = kl * 1000;
  s.full_kv_bytes_sum = 2000;
  s.peak_kv_bytes_sum = peak * 2000;
  s.evicted_slots = evicted_slots;
  s.texts = 2;
  return s;
}

TEST(EqualPeakTest, InterpolatesBetweenTheSweptPeaksAndNeverBeyond) {
  // lazy's budgets 20% and 30% hold 25% and 35% (C + W); given out of order.
  const std::vector<QualityConfig> configs = {
      {"full", 0.2, 103}, {"lazy", 0.3, 154}, {"lazy", 0.2, 103}, {"streaming", 0.2, 103}};
  const std::vector<QualityStats> stats = {Stats(1.0, 1.0, 0.0), Stats(0.35, 0.98, 0.01),
                                           Stats(0.25, 0.94, 0.03), Stats(0.2, 0.95, 0.02)};
  const std::vector<EqualPeakRow> rows = EqualPeak(configs, stats, {0.2, 0.3, 0.35, 0.5});
  ASSERT_EQ(rows.size(), 2u);  // full is not a row
  EXPECT_EQ(rows[0].policy, "lazy");
  EXPECT_FALSE(rows[0].never_evicts);
  EXPECT_FALSE(rows[0].at[0].has_value()) << "20% is below lazy's smallest peak (25%)";
  ASSERT_TRUE(rows[0].at[1].has_value());
  EXPECT_NEAR(rows[0].at[1]->top1, 0.96, 1e-12);  // halfway from 94% to 98%
  EXPECT_NEAR(rows[0].at[1]->kl, 0.02, 1e-12);
  ASSERT_TRUE(rows[0].at[2].has_value());
  EXPECT_NEAR(rows[0].at[2]->top1, 0.98, 1e-12);  // a swept point exactly
  EXPECT_FALSE(rows[0].at[3].has_value()) << "50% is beyond the sweep";
  EXPECT_EQ(rows[1].policy, "streaming");
  ASSERT_TRUE(rows[1].at[0].has_value());
  EXPECT_NEAR(rows[1].at[0]->top1, 0.95, 1e-12);
  EXPECT_FALSE(rows[1].at[1].has_value());
}

TEST(EqualPeakTest, APolicyThatNeverEvictsHasNoFigure) {
  // SnapKV on a prompt shorter than its budget: nothing evicted, no counted positions.
  QualityStats none;
  none.full_kv_bytes_sum = 2000;
  none.peak_kv_bytes_sum = 2000;
  const std::vector<QualityConfig> configs = {{"snapkv", 0.2, 103}, {"snapkv", 0.5, 256}};
  const std::vector<EqualPeakRow> rows = EqualPeak(configs, {none, none}, {0.2, 1.0});
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_TRUE(rows[0].never_evicts);
  EXPECT_FALSE(rows[0].at[0].has_value());
  EXPECT_FALSE(rows[0].at[1].has_value());
  const nlohmann::json json = EqualPeakJson(rows, {0.2, 1.0});
  EXPECT_TRUE(json["snapkv"]["never_evicts"].get<bool>());
  EXPECT_TRUE(json["snapkv"]["at"][0]["top1"].is_null());
}

TEST(EqualPeakTest, AHalfWidthKvTypeIsPlacedAtTheBytesItHolds) {
  // f16 runs hold half the bytes of the f32 runs of the same budgets: 40% of the f16 FullKV
  // is 20% of the f32 FullKV's bytes.
  const std::vector<QualityConfig> configs = {{"lazy+", 0.4, 205}, {"lazy+", 0.6, 308}};
  std::vector<QualityStats> f32 = {Stats(0.4, 0.985, 0.004), Stats(0.6, 0.995, 0.001)};
  std::vector<QualityStats> f16 = {Stats(0.4, 0.984, 0.004), Stats(0.6, 0.994, 0.001)};
  for (QualityStats& s : f16) {
    s.full_kv_bytes_sum /= 2;
    s.peak_kv_bytes_sum /= 2;
  }
  const std::vector<EqualPeakRow> own = EqualPeak(configs, f16, {0.2, 0.4});
  EXPECT_FALSE(own[0].at[0].has_value()) << "against its own FullKV it is at 40%";
  const std::vector<EqualPeakRow> rows = EqualPeak(configs, f16, {0.2, 0.3}, &f32, " f16");
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].policy, "lazy+ f16");
  ASSERT_TRUE(rows[0].at[0].has_value());
  EXPECT_NEAR(rows[0].at[0]->top1, 0.984, 1e-12);
  ASSERT_TRUE(rows[0].at[1].has_value());
  EXPECT_NEAR(rows[0].at[1]->top1, 0.994, 1e-12);
}

TEST(EqualPeakTest, BestAtEachPeakTakesTheHighestTop1ThenTheLowerKl) {
  EqualPeakRow a{"streaming",
                 false,
                 {},
                 {PeakPoint{0.2, 0.95, 0.02}, PeakPoint{0.3, 0.97, 0.01}, std::nullopt}};
  EqualPeakRow b{
      "lazy+", false, {}, {PeakPoint{0.2, 0.96, 0.03}, PeakPoint{0.3, 0.97, 0.005}, std::nullopt}};
  EXPECT_EQ(BestAtEachPeak({a, b}), (std::vector<std::string>{"lazy+", "lazy+", ""}));
}

}  // namespace
}  // namespace recall::bench
