#include "cache/eviction/caote.h"

#include <cmath>
#include <memory>
#include <vector>

#include "cache/eviction/eviction_policy.h"
#include "gtest/gtest.h"

namespace recall::cache::eviction {
namespace {

std::vector<double> Caote(const std::vector<double>& a, const std::vector<float>& values, int dim) {
  std::vector<double> c(a.size()), o;
  CaoteScores(a.data(), static_cast<int>(a.size()), values.data(), dim, &o, c.data());
  return c;
}

// Hand-computed case, head_dim 2: a = (0.5, 0.25, 0.25), v0 = (1, 0), v1 = (0, 1),
// v2 = (0, 0), so o = (0.5, 0.25) and
//   c0 = 0.5 / 0.5 * ||(-0.5, 0.25)||  = sqrt(0.3125)     = 0.55901699...
//   c1 = 0.25 / 0.75 * ||(0.5, -0.75)|| = sqrt(0.8125) / 3 = 0.30046260...
//   c2 = 0.25 / 0.75 * ||(0.5, 0.25)||  = sqrt(0.3125) / 3 = 0.18633899...
// Slots 1 and 2 have the same attention; the value far from the output ranks higher.
TEST(CaoteTest, HandComputedScores) {
  const std::vector<double> c = Caote({0.5, 0.25, 0.25}, {1, 0, 0, 1, 0, 0}, 2);
  EXPECT_NEAR(c[0], std::sqrt(0.3125), 1e-12);
  EXPECT_NEAR(c[1], std::sqrt(0.8125) / 3.0, 1e-12);
  EXPECT_NEAR(c[2], std::sqrt(0.3125) / 3.0, 1e-12);
}

// Scenario: a = (0.4, 0.3, 0.3), v0 = (0, 0), v1 = (1, 0), v2 = (-1, 0): o = (0, 0) = v0, so
// evicting the most attended slot 0 does not move the output at all (c0 = 0) while slots 1
// and 2 each move it by 0.3 / 0.7 * 1. CAOTE reverses the attention ranking.
TEST(CaoteTest, ValueEqualToTheOutputCostsNothing) {
  const std::vector<double> c = Caote({0.4, 0.3, 0.3}, {0, 0, 1, 0, -1, 0}, 2);
  EXPECT_NEAR(c[0], 0.0, 1e-12);
  EXPECT_NEAR(c[1], 0.3 / 0.7, 1e-12);
  EXPECT_NEAR(c[2], 0.3 / 0.7, 1e-12);
}

// Scenario: a_0 -> 1. With a = (1, 0) the literal a/(1-a) * ||o - v|| is 0/0 (o = v0); the
// guarded form gives c0 = a0 * ||v0|| = 5 (the output would vanish) and c1 = 0, so the slot
// holding all the attention ranks first. Just below 1 the score stays finite and first.
TEST(CaoteTest, AttentionNearOneStaysFiniteAndRanksFirst) {
  const std::vector<float> v = {3, 4, 0, 1};
  std::vector<double> c = Caote({1.0, 0.0}, v, 2);
  EXPECT_NEAR(c[0], 5.0, 1e-12);
  EXPECT_EQ(c[1], 0.0);
  for (double rest : {1e-3, 1e-7, 1e-12, 1e-20}) {
    c = Caote({1.0 - rest, rest}, v, 2);
    EXPECT_TRUE(std::isfinite(c[0])) << rest;
    EXPECT_GT(c[0], 4.0) << rest;  // ||v0 - v1|| = sqrt(18) = 4.24 in the limit
    EXPECT_LT(c[1], 1e-2) << rest;
  }
}

TEST(CaoteTest, NormalizeScoresAndGroupMeanAttention) {
  const double s[4] = {2.0, -1.0, 1.0, 1.0};
  double a[4];
  NormalizeScores(s, 4, a);
  EXPECT_DOUBLE_EQ(a[0], 0.5);
  EXPECT_DOUBLE_EQ(a[1], 0.0);  // negative scores count as 0
  EXPECT_DOUBLE_EQ(a[2], 0.25);
  const double zeros[2] = {0.0, 0.0};
  NormalizeScores(zeros, 2, a);
  EXPECT_EQ(a[0], 0.0);
  EXPECT_EQ(a[1], 0.0);

  // 4 query heads, 2 KV heads (G = 2), stride 3: KV head 1 = mean of query heads 2 and 3.
  const float probs[12] = {1, 0, 0, 0, 1, 0, 0.5f, 0.5f, 0, 0.25f, 0.25f, 0.5f};
  double m[3];
  GroupMeanAttention(probs, 4, 2, 3, 1, 3, m);
  EXPECT_DOUBLE_EQ(m[0], 0.375);
  EXPECT_DOUBLE_EQ(m[1], 0.375);
  EXPECT_DOUBLE_EQ(m[2], 0.25);
  GroupMeanAttention(probs, 4, 2, 3, 0, 2, m);
  EXPECT_DOUBLE_EQ(m[0], 0.5);
  EXPECT_DOUBLE_EQ(m[1], 0.5);
}

TEST(CaoteTest, CreatePolicyChecksWhichPoliciesTakeWhichMetaScore) {
  PolicyOptions o;
  o.meta_score = PolicyOptions::MetaScore::kCaote;
  for (const char* name : {"h2o", "tova", "snapkv", "lazy", "lazy+"}) {
    o.name = name;
    EXPECT_TRUE(CreatePolicy(o).ok()) << name;
  }
  for (const char* name : {"full", "streaming", "vase", "rkv"}) {
    o.name = name;
    absl::StatusOr<std::unique_ptr<EvictionPolicy>> p = CreatePolicy(o);
    ASSERT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << name;
    EXPECT_NE(p.status().message().find("meta_score"), absl::string_view::npos);
  }
  o.meta_score = PolicyOptions::MetaScore::kCaoteCurrentQuery;
  for (const std::string& name : PolicyNames()) {
    o.name = name;
    EXPECT_EQ(CreatePolicy(o).ok(), name != "snapkv") << name;
  }
}

}  // namespace
}  // namespace recall::cache::eviction
