#include "cache/eviction/snapkv_policy.h"

#include <cmath>
#include <memory>
#include <numeric>
#include <vector>

#include "cache/block_pool.h"
#include "cache/eviction/session_evictor.h"
#include "cache/sequence_cache.h"
#include "gtest/gtest.h"

namespace recall::cache::eviction {
namespace {

// Scenario: 6 slots, W = 2, head_dim 2, keys (ln a_j, 0) with a = 1..6, scale 1.
// Query head 0 = (1, 0): query 0 (slot 4) sees slots 0..4, p = a_j / 15; query 1 sees 0..5,
// p = a_j / 21; on candidates 0..3 the sum is a_j * 4 / 35 and the avg pool (kernel 5, / 5)
// gives (a0+a1+a2, a0..a3, a0..a3, a1+a2+a3) * 4 / 175 = (6, 10, 10, 9) * 4 / 175.
// Query head 1 = (0, 0): uniform, 1/5 + 1/6 = 11/30 per slot, pooled (3, 4, 4, 3) * 11 / 150.
// With both heads in one KV group (G = 2) the score is their mean.
TEST(SnapKvPolicyTest, WindowScoresSumCausalSoftmaxPoolAndAverageTheGroup) {
  std::vector<float> keys(12, 0.0f);
  for (int j = 0; j < 6; ++j) keys[j * 2] = std::log(static_cast<float>(j + 1));
  // queries [w = 2, n_heads = 2, head_dim = 2]
  const std::vector<float> q = {1, 0, 0, 0, 1, 0, 0, 0};
  SelectScratch scratch;
  float score[4];
  SnapKvPolicy::WindowScores(keys.data(), 6, q.data(), 2, 2, 0, 1, 2, 1.0f, &scratch, score);
  const double head0[4] = {6 * 4 / 175.0, 10 * 4 / 175.0, 10 * 4 / 175.0, 9 * 4 / 175.0};
  for (int j = 0; j < 4; ++j) EXPECT_NEAR(score[j], head0[j], 1e-6) << j;
  SnapKvPolicy::WindowScores(keys.data(), 6, q.data(), 2, 2, 1, 1, 2, 1.0f, &scratch, score);
  const double head1[4] = {3 * 11 / 150.0, 4 * 11 / 150.0, 4 * 11 / 150.0, 3 * 11 / 150.0};
  for (int j = 0; j < 4; ++j) EXPECT_NEAR(score[j], head1[j], 1e-6) << j;
  SnapKvPolicy::WindowScores(keys.data(), 6, q.data(), 2, 2, 0, 2, 2, 1.0f, &scratch, score);
  for (int j = 0; j < 4; ++j) EXPECT_NEAR(score[j], (head0[j] + head1[j]) / 2, 1e-6) << j;
}

TEST(SnapKvPolicyTest, NeverEvictsAtDecode) {
  PolicyOptions o;
  o.name = "snapkv";
  SnapKvPolicy snap(o);
  EXPECT_TRUE(snap.compresses_prefill());
  EXPECT_FALSE(snap.needs_attention());
  EXPECT_EQ(snap.min_budget(), 32);
  for (int t = 1; t <= 300; ++t) EXPECT_FALSE(snap.ShouldEvict(1000, 40, t));
}

// 2 layers, 1 KV head, 1 query head, head_dim 2, a 16-token prompt, W = 4. Keys (both
// layers): (x_j, 0) with x_1 = 0, x_9 = 1, window slots 12..15 x = 0, every other slot
// x = -200 (attention ~1e-87: vanishes exactly next to the others in double sums).
// Layer 0's window queries are (1, 0): slot 9 gets e times slot 1's attention; pooled with
// kernel 5, slots 7..11 carry slot 9's mass, slots 0..3 slot 1's, 4..6 ~nothing.
// Layer 1's queries are (0, 0): uniform, pooled weights 3, 4, 5, ..., 5, 4, 3 on 0..11.
class SnapKvSessionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto pool = BlockPool::Create(layout_, 64);  // 32 blocks of 4 tokens per layer
    ASSERT_TRUE(pool.ok());
    pool_ = std::move(*pool);
    seq_ = std::make_unique<SequenceCache>(pool_.get());
  }

  std::unique_ptr<SessionEvictor> Make(const std::string& policy, int budget) {
    SessionEvictorOptions o;
    o.policy.name = policy;
    o.policy.window = 4;
    o.budget.budget = budget;
    o.n_heads = 1;
    auto ev = SessionEvictor::Create(o, seq_.get());
    EXPECT_TRUE(ev.ok()) << ev.status();
    return ev.ok() ? std::move(*ev) : nullptr;
  }

  void Append(int n) {
    ASSERT_TRUE(seq_->Reserve(n).ok());
    std::vector<int32_t> pos(static_cast<size_t>(n));
    std::iota(pos.begin(), pos.end(), seq_->next_position());
    for (int l = 0; l < 2; ++l) {
      for (int i = 0; i < n; ++i) {
        const int p = pos[i];
        float* k = seq_->View().K(l, 0, seq_->length(l, 0) + i);
        k[0] = p == 9 ? 1.0f : (p == 1 || p >= 12 ? 0.0f : -200.0f);
        k[1] = 0.0f;
      }
    }
    seq_->CommitAppend(pos.data(), n);
  }

  std::vector<int32_t> Kept(int layer) const {
    std::vector<int32_t> kept;
    for (int s = 0; s < seq_->length(layer, 0); ++s) kept.push_back(seq_->position(layer, 0, s));
    return kept;
  }

  // [n_layers = 2, w = 4, n_heads = 1, head_dim = 2]
  const std::vector<float> queries_ = {1, 0, 1, 0, 1, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  kernels::PagedKvLayout layout_{2, 1, 2, 4};
  std::unique_ptr<BlockPool> pool_;
  std::unique_ptr<SequenceCache> seq_;
};

// C = 7: 3 candidates + the window. Layer 0: 7, 8, 9 (tied, older first); layer 1: 2, 3, 4
// (the first slots with a full pooling window). The decode steps after never evict.
TEST_F(SnapKvSessionTest, CompressPrefillKeepsTopPooledWindowAttentionPlusWindow) {
  std::unique_ptr<SessionEvictor> ev = Make("snapkv", 7);
  ASSERT_NE(ev, nullptr);
  Append(16);
  EXPECT_EQ(seq_->num_blocks(), 2 * 4);
  ASSERT_TRUE(ev->CompressPrefill(queries_.data(), 4, 1.0f).ok());
  EXPECT_EQ(Kept(0), (std::vector<int32_t>{7, 8, 9, 12, 13, 14, 15}));
  EXPECT_EQ(Kept(1), (std::vector<int32_t>{2, 3, 4, 12, 13, 14, 15}));
  EXPECT_EQ(seq_->num_blocks(), 2 * 2) << "blocks go back at once";
  EXPECT_EQ(ev->peak_kv_bytes(), 2 * 4 * pool_->block_bytes())
      << "the whole prompt was held before it was compressed";
  EXPECT_EQ(ev->evictions(), 2);
  EXPECT_EQ(ev->evicted_slots(), 18);
  for (int t = 1; t <= 5; ++t) {
    Append(1);
    ASSERT_TRUE(ev->Step(nullptr, 0).ok());
    EXPECT_EQ(seq_->length(0, 0), 7 + t);
  }
  EXPECT_EQ(ev->CompressPrefill(queries_.data(), 4, 1.0f).code(),
            absl::StatusCode::kFailedPrecondition);
}

// C = 10: 6 candidates. Layer 0: 7..11 and then 0 (older of the tied 0..3).
TEST_F(SnapKvSessionTest, LargerBudgetFillsFromTheNextTie) {
  std::unique_ptr<SessionEvictor> ev = Make("snapkv", 10);
  ASSERT_NE(ev, nullptr);
  Append(16);
  ASSERT_TRUE(ev->CompressPrefill(queries_.data(), 4, 1.0f).ok());
  EXPECT_EQ(Kept(0), (std::vector<int32_t>{0, 7, 8, 9, 10, 11, 12, 13, 14, 15}));
  EXPECT_EQ(Kept(1), (std::vector<int32_t>{2, 3, 4, 5, 6, 7, 12, 13, 14, 15}));
}

TEST_F(SnapKvSessionTest, PromptWithinBudgetIsUntouched) {
  std::unique_ptr<SessionEvictor> ev = Make("snapkv", 16);
  ASSERT_NE(ev, nullptr);
  Append(16);
  ASSERT_TRUE(ev->CompressPrefill(queries_.data(), 4).ok());
  EXPECT_EQ(seq_->length(0, 0), 16);
  EXPECT_EQ(ev->evictions(), 0);
  Append(1);
  EXPECT_TRUE(ev->Step(nullptr, 0).ok());
  EXPECT_EQ(ev->CompressPrefill(queries_.data(), 4).code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(SnapKvSessionTest, BadCallsAreErrorsAndChangeNothing) {
  std::unique_ptr<SessionEvictor> ev = Make("snapkv", 7);
  ASSERT_NE(ev, nullptr);
  Append(16);
  EXPECT_EQ(ev->CompressPrefill(queries_.data(), 3).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ev->CompressPrefill(nullptr, 4).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(seq_->length(0, 0), 16);
  std::unique_ptr<SessionEvictor> h2o = Make("h2o", 7);
  ASSERT_NE(h2o, nullptr);
  EXPECT_EQ(h2o->CompressPrefill(queries_.data(), 4).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(ev->Step(nullptr, 0).code(), absl::StatusCode::kFailedPrecondition)
      << "Step before CompressPrefill would silently run FullKV";
  EXPECT_EQ(ev->step(), 0);
  EXPECT_EQ(seq_->length(0, 0), 16);
}

}  // namespace
}  // namespace recall::cache::eviction
