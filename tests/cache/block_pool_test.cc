#include "cache/block_pool.h"

#include <set>

#include "gtest/gtest.h"

namespace recall::cache {
namespace {

kernels::PagedKvLayout SmallLayout() { return {2, 3, 4, 8}; }  // layers, kv heads, d, B

TEST(BlockPool, HandsOutEveryBlockOnceThenReportsExhaustion) {
  auto pool = BlockPool::Create(SmallLayout(), 5);
  ASSERT_TRUE(pool.ok()) << pool.status();
  std::set<int32_t> ids;
  for (int i = 0; i < 5; ++i) {
    auto b = (*pool)->Allocate();
    ASSERT_TRUE(b.ok());
    EXPECT_TRUE(ids.insert(*b).second) << "block " << *b << " handed out twice";
  }
  EXPECT_EQ((*pool)->free_blocks(), 0);
  auto none = (*pool)->Allocate();
  EXPECT_EQ(none.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(none.status().message().find("5 blocks"), std::string::npos);
  (*pool)->Free(*ids.begin());
  EXPECT_EQ((*pool)->free_blocks(), 1);
  EXPECT_TRUE((*pool)->Allocate().ok());
}

TEST(BlockPool, BlockBytesCoverOneLayersHeadsKAndV) {
  auto pool = BlockPool::Create(SmallLayout(), 1);
  ASSERT_TRUE(pool.ok());
  EXPECT_EQ((*pool)->block_bytes(), 3 * 2 * 8 * 4 * 4);  // H*(K,V)*B*d*sizeof(float)
}

TEST(BlockPool, RejectsBadLayoutAndSizes) {
  EXPECT_EQ(BlockPool::Create({0, 3, 4, 8}, 4).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(BlockPool::Create(SmallLayout(), 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto tiny = BlockPool::CreateWithBytes(SmallLayout(), 10);
  EXPECT_EQ(tiny.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(tiny.status().message().find("less than one block"), std::string::npos);
  auto sized = BlockPool::CreateWithBytes(SmallLayout(), 3 * 768 + 100);
  ASSERT_TRUE(sized.ok());
  EXPECT_EQ((*sized)->num_blocks(), 3);
}

TEST(BlockPoolDeathTest, DoubleFreeIsABrokenInvariant) {
  auto pool = BlockPool::Create(SmallLayout(), 2);
  ASSERT_TRUE(pool.ok());
  const int32_t b = *(*pool)->Allocate();
  (*pool)->Free(b);
  EXPECT_DEATH((*pool)->Free(b), "double free");
}

}  // namespace
}  // namespace recall::cache
