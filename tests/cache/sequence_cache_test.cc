#include "cache/sequence_cache.h"

#include <numeric>

#include "gtest/gtest.h"
#include "kernels/kv_rows.h"

namespace recall::cache {
namespace {

class SequenceCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto pool = BlockPool::Create(layout_, 32);  // 16 blocks of 4 tokens per layer
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
    EXPECT_EQ(seq.num_blocks(), 4);  // two blocks in each of the two layers
    EXPECT_EQ(seq.num_blocks(1), 2);
    Append(seq, 3);
    EXPECT_EQ(seq.num_blocks(), 4);  // 8 slots fit in two blocks of 4
    Append(seq, 1);
    EXPECT_EQ(seq.num_blocks(), 6);
    EXPECT_EQ(seq.capacity(0), 12);
    EXPECT_EQ(seq.bytes_held(), 6 * pool_->block_bytes());
    EXPECT_EQ(seq.next_position(), 9);
    EXPECT_EQ(pool_->free_blocks(), 26);
    EXPECT_EQ(seq.position(1, 1, 8), 8);
    EXPECT_EQ(seq.View().K(1, 1, 8)[0], 8 + 0.5f + 100.0f);
  }
  EXPECT_EQ(pool_->free_blocks(), 32) << "destroying the sequence must return all blocks";
}

TEST_F(SequenceCacheTest, SetNextPositionRewindsPastCompactedSlotsAndSkipsForward) {
  SequenceCache seq(pool_.get());
  Append(seq, 6);
  const std::vector<int32_t> keep = {0, 1, 2, 3};  // the last two slots (positions 4, 5) go
  for (int l = 0; l < 2; ++l) {
    for (int h = 0; h < 2; ++h) seq.Compact(l, h, keep);
  }
  seq.SetNextPosition(4);
  Append(seq, 1);
  EXPECT_EQ(seq.position(0, 1, 4), 4) << "the freed position is reused";
  seq.SetNextPosition(20);
  Append(seq, 1);
  EXPECT_EQ(seq.position(1, 0, 5), 20);
  EXPECT_EQ(seq.next_position(), 21);
  EXPECT_DEATH(seq.SetNextPosition(20), "held slot");
}

// Heads compacted unevenly (head 1 of layer 0 lost positions 6 and 8): DropNewest(3) takes
// the tokens at 7, 8 and 9 out of every row that has them, frees the blocks no head needs and
// the next token goes where the first of them was.
TEST_F(SequenceCacheTest, DropNewestGivesBackTheLastTokensOfEveryRowAndTheirBlocks) {
  SequenceCache seq(pool_.get());
  Append(seq, 10);
  seq.Compact(0, 1, {0, 1, 2, 3, 4, 5, 7, 9});
  EXPECT_EQ(seq.num_blocks(), 6);
  seq.DropNewest(3);
  EXPECT_EQ(seq.length(0, 0), 7);
  EXPECT_EQ(seq.length(0, 1), 6);
  EXPECT_EQ(seq.length(1, 1), 7);
  EXPECT_EQ(seq.next_position(), 7);
  EXPECT_EQ(seq.sequence_length(), 7);
  EXPECT_EQ(seq.num_blocks(), 4) << "two blocks of 4 per layer hold 7 slots";
  EXPECT_EQ(pool_->free_blocks(), 28);
  Append(seq, 1);
  EXPECT_EQ(seq.position(0, 1, 6), 7);
  EXPECT_EQ(seq.View().K(0, 1, 6)[0], 7 + 0.5f);
  EXPECT_EQ(seq.position(1, 0, 6), 6) << "the slots kept are untouched";
  EXPECT_EQ(seq.View().K(1, 0, 6)[0], 6 + 100.0f);
  seq.DropNewest(0);
  EXPECT_EQ(seq.length(1, 0), 8);
  EXPECT_DEATH(seq.DropNewest(9), "DropNewest");
}

// After a re-positioning (each row's slots moved to end just before position 10, head 1 of
// layer 0, which lost token 8, one shorter) the tokens are found by when they were fed, not by
// position: DropNewest(3) takes tokens 8, 9 and 10 out, and the next token follows the newest
// position kept.
TEST_F(SequenceCacheTest, DropNewestFindsItsTokensAfterARepositioning) {
  SequenceCache seq(pool_.get());
  Append(seq, 10);
  seq.Compact(0, 1, {0, 1, 2, 3, 4, 5, 6, 7, 9});
  const int64_t stride = 10;
  std::vector<int32_t> to(static_cast<size_t>(4 * stride), 0);
  for (int lh = 0; lh < 4; ++lh) {
    const int len = seq.length(lh / 2, lh % 2);
    for (int s = 0; s < len; ++s) to[static_cast<size_t>(lh * stride + s)] = 10 - len + s;
  }
  seq.MovePositions(to.data(), stride, 10);
  Append(seq, 1);
  ASSERT_EQ(seq.sequence_length(), 11);
  seq.DropNewest(3);
  EXPECT_EQ(seq.length(0, 0), 8);
  EXPECT_EQ(seq.length(0, 1), 8) << "token 7 (at position 8 now) stays";
  EXPECT_EQ(seq.position(0, 1, 7), 8);
  EXPECT_EQ(seq.position(1, 1, 7), 7);
  EXPECT_EQ(seq.sequence_length(), 8);
  EXPECT_EQ(seq.next_position(), 9);
  Append(seq, 1);
  EXPECT_EQ(seq.position(0, 0, 8), 9);
  EXPECT_EQ(seq.sequence_length(), 9);
}

TEST_F(SequenceCacheTest, AnOffloadedCacheRebindsToAnotherPoolAndRestoresThere) {
  auto other = BlockPool::Create(layout_, 8);
  ASSERT_TRUE(other.ok());
  SequenceCache seq(pool_.get());
  Append(seq, 6);
  EXPECT_EQ(seq.Rebind(other->get()).code(), absl::StatusCode::kFailedPrecondition);
  seq.OffloadToHost();
  ASSERT_TRUE(seq.Rebind(other->get()).ok());
  ASSERT_TRUE(seq.RestoreFromHost().ok());
  EXPECT_EQ((*other)->free_blocks(), 4);
  EXPECT_EQ(pool_->free_blocks(), 32);
  EXPECT_EQ(seq.View().K(1, 1, 5)[0], 5 + 0.5f + 100.0f);
  auto odd = BlockPool::Create({2, 2, 4, 8}, 8);
  ASSERT_TRUE(odd.ok());
  seq.OffloadToHost();
  EXPECT_EQ(seq.Rebind(odd->get()).code(), absl::StatusCode::kInvalidArgument);
  seq.Release();
}

TEST_F(SequenceCacheTest, ReserveFailureLeavesSequenceUnchanged) {
  SequenceCache big(pool_.get());
  Append(big, 4 * 13);  // 13 blocks per layer
  SequenceCache seq(pool_.get());
  Append(seq, 4);  // 1 block per layer; 4 left in the pool
  EXPECT_EQ(seq.BlocksNeededFor(9), 6);
  // Needs 3 more blocks per layer: layer 0 gets its 3, layer 1 fails, all go back.
  const absl::Status st = seq.Reserve(9);
  EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(seq.num_blocks(), 2);
  EXPECT_EQ(seq.num_blocks(0), 1);
  EXPECT_EQ(seq.num_blocks(1), 1);
  EXPECT_EQ(pool_->free_blocks(), 4);
  Append(seq, 1);  // still usable
  EXPECT_EQ(seq.num_blocks(), 4);
}

TEST_F(SequenceCacheTest, CompactMovesKVAndPositionsTogetherAndTrimFreesBlocks) {
  SequenceCache seq(pool_.get());
  Append(seq, 10);  // 3 blocks per layer
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
  EXPECT_EQ(seq.TrimBlocks(), 4);
  EXPECT_EQ(seq.num_blocks(), 2);
  EXPECT_EQ(pool_->free_blocks(), 30);
  EXPECT_EQ(seq.next_position(), 10) << "positions keep counting after eviction";
}

TEST_F(SequenceCacheTest, HeadsMayHoldDifferentLengths) {
  SequenceCache seq(pool_.get());
  Append(seq, 8);
  seq.Compact(0, 1, {1, 2});
  EXPECT_EQ(seq.length(0, 0), 8);
  EXPECT_EQ(seq.length(0, 1), 2);
  EXPECT_EQ(seq.TrimBlocks(), 0) << "head (0,0) still needs both blocks of layer 0";
  for (int l = 0; l < 2; ++l) {
    for (int h = 0; h < 2; ++h) seq.Compact(l, h, {0});
  }
  EXPECT_EQ(seq.TrimBlocks(), 2);  // one per layer
  EXPECT_EQ(seq.num_blocks(), 2);
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
  Append(seq, 12);  // 3 blocks of 4 per layer
  seq.OffloadToHost();
  SequenceCache hog(pool_.get());
  ASSERT_TRUE(hog.Reserve(15 * 4).ok());  // 30 of the 32 blocks
  EXPECT_EQ(seq.RestoreFromHost().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(seq.offloaded());
  hog.Release();
  EXPECT_TRUE(seq.RestoreFromHost().ok());
  EXPECT_EQ(seq.View().K(1, 1, 11)[0], 11 + 0.5f + 100.0f);
}

// Scenario: each layer holds the blocks its own longest head needs. Layer 0 is compacted to
// 3 slots, layer 1 keeps all 10: TrimBlocks frees 2 blocks of layer 0 only, the rows of both
// layers stay where the kernels read them, and growing, offloading and restoring keep the
// per-layer counts.
TEST_F(SequenceCacheTest, LayersHoldBlocksForTheirOwnLengths) {
  SequenceCache seq(pool_.get());
  Append(seq, 10);  // 3 blocks per layer
  const std::vector<int32_t> keep = {0, 4, 9};
  for (int h = 0; h < 2; ++h) seq.Compact(0, h, keep);
  EXPECT_EQ(seq.max_length(0), 3);
  EXPECT_EQ(seq.max_length(1), 10);
  EXPECT_EQ(seq.TrimBlocks(), 2);
  EXPECT_EQ(seq.num_blocks(0), 1);
  EXPECT_EQ(seq.num_blocks(1), 3);
  EXPECT_EQ(seq.num_blocks(), 4);
  EXPECT_EQ(seq.bytes_held(), 4 * pool_->block_bytes());
  EXPECT_EQ(pool_->free_blocks(), 28);
  EXPECT_EQ(seq.capacity(0), 4);
  EXPECT_EQ(seq.View().capacity(1), 12);
  auto check = [&](int extra) {
    for (int h = 0; h < 2; ++h) {
      for (int i = 0; i < 3; ++i) {
        EXPECT_EQ(seq.View().K(0, h, i)[1], keep[i] + 0.5f * h) << h << "," << i;
      }
      for (int s = 0; s < 10 + extra; ++s) {
        EXPECT_EQ(seq.View().V(1, h, s)[2], -(s + 0.5f * h + 100.0f)) << h << "," << s;
      }
    }
  };
  check(0);
  // 3 more tokens: layer 0 needs 6 slots (2 blocks, +1), layer 1 13 slots (4 blocks, +1).
  EXPECT_EQ(seq.BlocksNeededFor(3), 2);
  EXPECT_EQ(seq.BlocksNeededFor(2), 1) << "12 slots still fit layer 1's 3 blocks";
  Append(seq, 3);
  EXPECT_EQ(seq.num_blocks(0), 2);
  EXPECT_EQ(seq.num_blocks(1), 4);
  EXPECT_EQ(seq.length(0, 1), 6);
  EXPECT_EQ(seq.View().K(0, 1, 5)[0], 12 + 0.5f);
  check(3);
  // Offload and restore with different counts per layer.
  seq.OffloadToHost();
  EXPECT_EQ(seq.num_blocks(), 0);
  EXPECT_EQ(seq.host_bytes(), 6 * pool_->block_bytes());
  EXPECT_EQ(seq.BlocksNeededFor(0), 6) << "an offloaded cache needs its blocks back";
  EXPECT_EQ(seq.BlocksNeededFor(4), 8) << "10 and 17 slots: 3 and 5 blocks";
  SequenceCache other(pool_.get());
  Append(other, 8);
  ASSERT_TRUE(seq.RestoreFromHost().ok());
  EXPECT_EQ(seq.num_blocks(0), 2);
  EXPECT_EQ(seq.num_blocks(1), 4);
  check(3);
}

// Scenario: offload then restore of a cache in each KV type gives back the same bytes, rows
// and int8 scales alike, in blocks that another sequence scribbled on meanwhile; the block
// size follows the type.
TEST(SequenceCacheTypedTest, OffloadAndRestoreAreBitExactForEveryType) {
  for (const kernels::KvDType t : {kernels::KvDType::kF32, kernels::KvDType::kBF16,
                                   kernels::KvDType::kF16, kernels::KvDType::kInt8}) {
    SCOPED_TRACE(kernels::KvDTypeName(t));
    const kernels::PagedKvLayout layout{2, 2, 8, 4, t};
    auto pool = BlockPool::Create(layout, 32);
    ASSERT_TRUE(pool.ok());
    EXPECT_EQ((*pool)->block_bytes(),
              2 * 2 * (4 * 8 * kernels::KvElemBytes(t) + (t == kernels::KvDType::kInt8 ? 16 : 0)));
    SequenceCache seq(pool->get());
    ASSERT_TRUE(seq.Reserve(10).ok());
    std::vector<int32_t> pos(10);
    std::iota(pos.begin(), pos.end(), 0);
    const kernels::PagedKv kv = seq.View();
    std::vector<float> row(8);
    for (int l = 0; l < 2; ++l) {
      for (int h = 0; h < 2; ++h) {
        for (int s = 0; s < 10; ++s) {
          for (int d = 0; d < 8; ++d) row[d] = 0.37f * (s + 1) * (d - 3.5f) + l - 0.1f * h;
          kernels::StoreKvRow(kv.Head(l, h), 0, s, row.data());
          for (float& x : row) x = -x / 3;
          kernels::StoreKvRow(kv.Head(l, h), 1, s, row.data());
        }
      }
    }
    seq.CommitAppend(pos.data(), 10);
    // Every byte the cache's blocks hold, in table order.
    auto contents = [&] {
      std::vector<uint8_t> bytes;
      const kernels::PagedKv v = seq.View();
      for (int l = 0; l < 2; ++l) {
        for (int b = 0; b < v.block_counts[l]; ++b) {
          const uint8_t* p =
              static_cast<const uint8_t*>(v.pool) + v.block_tables[l][b] * layout.BlockBytes();
          bytes.insert(bytes.end(), p, p + layout.BlockBytes());
        }
      }
      return bytes;
    };
    const std::vector<uint8_t> before = contents();
    seq.OffloadToHost();
    SequenceCache other(pool->get());
    ASSERT_TRUE(other.Reserve(12).ok());
    const kernels::PagedKv o = other.View();
    for (int l = 0; l < 2; ++l) {
      for (int b = 0; b < o.block_counts[l]; ++b) {
        uint8_t* p = static_cast<uint8_t*>(o.pool) + o.block_tables[l][b] * layout.BlockBytes();
        std::fill(p, p + layout.BlockBytes(), uint8_t{0xEE});
      }
    }
    ASSERT_TRUE(seq.RestoreFromHost().ok());
    EXPECT_EQ(contents(), before);
  }
}

}  // namespace
}  // namespace recall::cache
