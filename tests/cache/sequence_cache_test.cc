#include "cache/sequence_cache.h"

#include <numeric>

#include "gtest/gtest.h"

namespace recall::cache {
namespace {

class SequenceCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto pool = BlockPool::Create(layout_, 16);
    ASSERT_TRUE(pool.ok());
    pool_ = std::move(*pool);
  }
  // Appends n tokens, writing K = position + 0.5*head + 100*layer in every element.
  void Append(SequenceCache& seq, int n) {
    ASSERT_TRUE(seq.Reserve(n).ok());
    std::vector<int32_t> pos(n);
    std::iota(pos.begin(), pos.end(), seq.next_position());
    const kernels::PagedKv kv = seq.View();
    for (int l = 0; l < layout_.n_layers; ++l) {
      for (int h = 0; h < layout_.n_kv_heads; ++h) {
        for (int i = 0; i < n; ++i) {
          const int slot = seq.length(l, h) + i;
          for (int d = 0; d < layout_.head_dim; ++d) {
            kv.K(l, h, slot)[d] = pos[i] + 0.5f * h + 100.0f * l;
            kv.V(l, h, slot)[d] = -(pos[i] + 0.5f * h + 100.0f * l);
          }
        }
      }
    }
    seq.CommitAppend(pos.data(), n);
  }

  kernels::PagedKvLayout layout_{2, 2, 4, 4};
  std::unique_ptr<BlockPool> pool_;
};

TEST_F(SequenceCacheTest, AppendAllocatesBlocksAndReleaseReturnsEveryOne) {
  {
    SequenceCache seq(pool_.get());
    Append(seq, 5);
    EXPECT_EQ(seq.num_blocks(), 2);
    Append(seq, 3);
    EXPECT_EQ(seq.num_blocks(), 2);  // 8 slots fit in two blocks of 4
    Append(seq, 1);
    EXPECT_EQ(seq.num_blocks(), 3);
    EXPECT_EQ(seq.next_position(), 9);
    EXPECT_EQ(pool_->free_blocks(), 13);
    EXPECT_EQ(seq.position(1, 1, 8), 8);
    EXPECT_EQ(seq.View().K(1, 1, 8)[0], 8 + 0.5f + 100.0f);
  }
  EXPECT_EQ(pool_->free_blocks(), 16) << "destroying the sequence must return all blocks";
}

TEST_F(SequenceCacheTest, ReserveFailureLeavesSequenceUnchanged) {
  SequenceCache big(pool_.get());
  Append(big, 4 * 14);  // 14 blocks
  SequenceCache seq(pool_.get());
  Append(seq, 4);  // 1 block; 1 left in the pool
  const absl::Status st = seq.Reserve(9);  // needs 3 more blocks
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(seq.num_blocks(), 1);
  EXPECT_EQ(pool_->free_blocks(), 1);
}

TEST_F(SequenceCacheTest, CompactMovesKVAndPositionsTogetherAndTrimFreesBlocks) {
  SequenceCache seq(pool_.get());
  Append(seq, 10);  // 3 blocks
  const std::vector<int32_t> keep = {0, 3, 7, 9};
  for (int l = 0; l < 2; ++l) {
    for (int h = 0; h < 2; ++h) seq.Compact(l, h, keep);
  }
  for (int l = 0; l < 2; ++l) {
    for (int h = 0; h < 2; ++h) {
      ASSERT_EQ(seq.length(l, h), 4);
      for (int i = 0; i < 4; ++i) {
        EXPECT_EQ(seq.position(l, h, i), keep[i]);
        EXPECT_EQ(seq.View().K(l, h, i)[3], keep[i] + 0.5f * h + 100.0f * l);
        EXPECT_EQ(seq.View().V(l, h, i)[0], -(keep[i] + 0.5f * h + 100.0f * l));
      }
    }
  }
  EXPECT_EQ(seq.TrimBlocks(), 2);
  EXPECT_EQ(seq.num_blocks(), 1);
  EXPECT_EQ(pool_->free_blocks(), 15);
  EXPECT_EQ(seq.next_position(), 10) << "positions keep counting after eviction";
}

TEST_F(SequenceCacheTest, HeadsMayHoldDifferentLengths) {
  SequenceCache seq(pool_.get());
  Append(seq, 8);
  seq.Compact(0, 1, {1, 2});
  EXPECT_EQ(seq.length(0, 0), 8);
  EXPECT_EQ(seq.length(0, 1), 2);
  EXPECT_EQ(seq.TrimBlocks(), 0) << "head (0,0) still needs both blocks";
  for (int l = 0; l < 2; ++l) {
    for (int h = 0; h < 2; ++h) seq.Compact(l, h, {0});
  }
  EXPECT_EQ(seq.TrimBlocks(), 1);
}

TEST_F(SequenceCacheTest, OffloadFreesBlocksAndRestoreBringsTheSameContentsBack) {
  SequenceCache seq(pool_.get());
  Append(seq, 10);
  std::vector<int32_t> keep = {0, 3, 9};
  seq.Compact(1, 0, keep);
  const int blocks = seq.num_blocks();
  const int64_t free_before = pool_->free_blocks();
  seq.OffloadToHost();
  EXPECT_TRUE(seq.offloaded());
  EXPECT_EQ(seq.num_blocks(), 0);
  EXPECT_EQ(pool_->free_blocks(), free_before + blocks);
  EXPECT_EQ(seq.host_bytes(), blocks * pool_->block_bytes());
  EXPECT_EQ(seq.length(1, 0), 3);
  EXPECT_EQ(seq.position(1, 0, 2), 9);
  // Another sequence takes (and scribbles on) the freed blocks meanwhile.
  SequenceCache other(pool_.get());
  Append(other, 8);
  ASSERT_TRUE(seq.RestoreFromHost().ok());
  EXPECT_FALSE(seq.offloaded());
  EXPECT_EQ(seq.num_blocks(), blocks);
  EXPECT_EQ(seq.host_bytes(), 0);
  const kernels::PagedKv kv = seq.View();
  EXPECT_EQ(kv.K(0, 1, 7)[0], 7 + 0.5f);
  EXPECT_EQ(kv.V(1, 0, 2)[3], -(9 + 100.0f));  // the compacted slot kept its row
  Append(seq, 1);  // and the cache is usable again
  EXPECT_EQ(seq.next_position(), 11);
}

TEST_F(SequenceCacheTest, RestoreWithoutRoomFailsAndStaysOffloaded) {
  SequenceCache seq(pool_.get());
  Append(seq, 12);  // 3 blocks of 4
  seq.OffloadToHost();
  SequenceCache hog(pool_.get());
  ASSERT_TRUE(hog.Reserve(15 * 4).ok());  // 15 of the 16 blocks
  EXPECT_EQ(seq.RestoreFromHost().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(seq.offloaded());
  hog.Release();
  EXPECT_TRUE(seq.RestoreFromHost().ok());
  EXPECT_EQ(seq.View().K(1, 1, 11)[0], 11 + 0.5f + 100.0f);
}

}  // namespace
}  // namespace recall::cache
