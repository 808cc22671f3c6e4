// Per-layer block tables: with a pyramid budget every layer holds only the blocks its own
// budget needs, so the cache holds sum_l ceil(C_l / block_tokens) blocks, fewer than one
// block table sized by the largest layer (n_layers * ceil(max_l C_l / block_tokens)).
#include <algorithm>
#include <memory>
#include <numeric>
#include <vector>

#include "cache/block_pool.h"
#include "cache/eviction/budget.h"
#include "cache/eviction/session_evictor.h"
#include "cache/sequence_cache.h"
#include "gtest/gtest.h"
#include "tests/cache/eviction/append_rows.h"

namespace recall::cache::eviction {
namespace {

constexpr int kLayers = 4, kKv = 2, kDim = 4, kBlock = 4;

void Append(SequenceCache& seq, int n) {
  testing::AppendRows(
      seq, n, [](int, int, int, int) { return 0.0f; },
      [](int p, int, int, int) { return static_cast<float>(p); });
}

int Blocks(int slots) { return (slots + kBlock - 1) / kBlock; }

// Scenario: streaming (4 sinks, so every layer gets at least 5 slots), pyramid budgets of
// C = 12 on average over 4 layers, a 40-token prompt, then 10 decode steps. After each step
// layer l holds exactly C_l slots in C_l / 4 blocks (rounded up); the pool hands out
// exactly their sum, strictly fewer than 4 tables of the largest layer's size.
TEST(PerLayerMemoryTest, PyramidBudgetsHoldOnlyEachLayersBlocks) {
  auto pool = BlockPool::Create({kLayers, kKv, kDim, kBlock}, kLayers * 16);
  ASSERT_TRUE(pool.ok());
  SequenceCache seq(pool->get());
  SessionEvictorOptions o;
  o.policy.name = "streaming";
  o.budget.kind = BudgetOptions::Kind::kPyramid;
  o.budget.budget = 12;
  o.n_heads = kKv;
  auto ev = SessionEvictor::Create(o, &seq);
  ASSERT_TRUE(ev.ok()) << ev.status();
  // The expectation, from the allocator itself (the evictor raises `reserved` to the
  // policy's min_budget(): sinks + 1).
  BudgetOptions b = o.budget;
  b.reserved = 5;
  auto allocator = BudgetAllocator::Create(b, kLayers);
  ASSERT_TRUE(allocator.ok()) << allocator.status();

  Append(seq, 40);
  EXPECT_EQ((*pool)->used_blocks(), kLayers * Blocks(40));
  for (int t = 1; t <= 10; ++t) {
    Append(seq, 1);
    ASSERT_TRUE((*ev)->Step(nullptr, 0).ok());
    std::vector<int32_t> budgets(kLayers);
    allocator->Allocate(seq.next_position(), budgets.data());
    ASSERT_EQ((*ev)->budgets(), budgets) << "t=" << t;
    ASSERT_GT(budgets.front(), budgets.back()) << "pyramid: early layers keep more";
    int expected = 0;
    for (int l = 0; l < kLayers; ++l) {
      for (int h = 0; h < kKv; ++h) ASSERT_EQ(seq.length(l, h), budgets[l]) << l << "," << h;
      EXPECT_EQ(seq.num_blocks(l), Blocks(budgets[l])) << "t=" << t << " layer " << l;
      expected += Blocks(budgets[l]);
    }
    EXPECT_EQ(seq.num_blocks(), expected);
    EXPECT_EQ((*pool)->used_blocks(), expected) << "t=" << t;
    EXPECT_EQ((*ev)->final_kv_bytes(), expected * (*pool)->block_bytes());
    const int largest = *std::max_element(budgets.begin(), budgets.end());
    EXPECT_LT(expected, kLayers * Blocks(largest)) << "t=" << t;
  }
  // V rows still belong to their tokens after the per-layer compactions.
  for (int l = 0; l < kLayers; ++l) {
    for (int s = 0; s < seq.length(l, 1); ++s) {
      EXPECT_EQ(seq.View().V(l, 1, s)[0], static_cast<float>(seq.position(l, 1, s)));
    }
  }
}

}  // namespace
}  // namespace recall::cache::eviction
