// PatchScores against a direct evaluation of its formula (max over query heads and patch
// queries of the causal softmax), and the top-k selections' budgets, order and ties.
#include "cache/episodic/patch_scores.h"

#include <cmath>
#include <random>

#include "gtest/gtest.h"

namespace recall::cache::episodic {
namespace {

TEST(PatchScoresTest, MaxOfCausalSoftmaxOverQueriesAndGroupHeads) {
  const int base = 7, p = 3, n_heads = 4, head_dim = 5, first_head = 2, group = 2;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  std::vector<float> keys((base + p) * head_dim), queries(p * n_heads * head_dim);
  for (float& x : keys) x = normal(rng);
  for (float& x : queries) x = normal(rng);
  const float scale = 0.4f;
  std::vector<double> scratch;
  std::vector<float> score(base);
  PatchScores(keys.data(), base, queries.data(), p, n_heads, first_head, group, head_dim, scale,
              &scratch, score.data());
  for (int j = 0; j < base; ++j) {
    double want = 0;
    for (int g = 0; g < group; ++g) {
      for (int i = 0; i < p; ++i) {
        const float* q = &queries[(i * n_heads + first_head + g) * head_dim];
        std::vector<double> e(base + i + 1);
        double z = 0;
        for (int m = 0; m <= base + i; ++m) {
          double dot = 0;
          for (int d = 0; d < head_dim; ++d) dot += q[d] * keys[m * head_dim + d];
          e[m] = std::exp(scale * dot);
          z += e[m];
        }
        want = std::max(want, e[j] / z);
      }
    }
    EXPECT_NEAR(score[j], want, 1e-6) << "slot " << j;
  }
}

TEST(PatchScoresTest, AKeyAlignedWithTheQueriesScoresHighest) {
  const int base = 4, p = 1, head_dim = 2;
  const std::vector<float> keys = {0, 1, 1, 0, 0, -1, -1, 0, 1, 0};  // slot 1 matches q
  const std::vector<float> queries = {5, 0};
  std::vector<double> scratch;
  std::vector<float> score(base);
  PatchScores(keys.data(), base, queries.data(), p, 1, 0, 1, head_dim, 1.0f, &scratch,
              score.data());
  EXPECT_GT(score[1], score[0]);
  EXPECT_GT(score[1], 0.4f);
  EXPECT_LT(score[3], 0.01f);
}

TEST(KeepTopTest, KeepsTheBestAscendingWithTiesToTheOlderSlot) {
  const std::vector<float> score = {0.1f, 0.5f, 0.5f, 0.9f, 0.5f, 0.0f};
  std::vector<int32_t> order, keep;
  KeepTop(score.data(), 6, 3, &order, &keep);
  EXPECT_EQ(keep, (std::vector<int32_t>{1, 2, 3}));
  KeepTop(score.data(), 6, 10, &order, &keep);
  EXPECT_EQ(keep, (std::vector<int32_t>{0, 1, 2, 3, 4, 5}));
  KeepTop(score.data(), 6, 0, &order, &keep);
  EXPECT_TRUE(keep.empty());
}

TEST(KeepTopTest, AcrossHeadsKeepsTheGlobalBestSoHeadsKeepDifferentCounts) {
  const std::vector<float> h0 = {0.9f, 0.8f, 0.7f, 0.1f};
  const std::vector<float> h1 = {0.2f, 0.85f, 0.05f};
  std::vector<std::vector<int32_t>> keeps;
  KeepTopAcrossHeads({h0.data(), h1.data()}, {4, 3}, 4, &keeps);
  ASSERT_EQ(keeps.size(), 2u);
  EXPECT_EQ(keeps[0], (std::vector<int32_t>{0, 1, 2}));
  EXPECT_EQ(keeps[1], (std::vector<int32_t>{1}));
  KeepTopAcrossHeads({h0.data(), h1.data()}, {4, 3}, 100, &keeps);
  EXPECT_EQ(keeps[0].size() + keeps[1].size(), 7u);
  const std::vector<float> tie = {0.5f, 0.5f};
  KeepTopAcrossHeads({tie.data(), tie.data()}, {2, 2}, 1, &keeps);
  EXPECT_EQ(keeps[0], (std::vector<int32_t>{0})) << "ties go to the lower head, older slot";
  EXPECT_TRUE(keeps[1].empty());
}

}  // namespace
}  // namespace recall::cache::episodic
