// Sharding: which heads and MLP columns each rank holds, replication of KV heads past
// tp = n_kv_heads, and the tp values a model cannot be split by.
#include "worker/runtime/tp/shard.h"

#include "gtest/gtest.h"
#include "tests/worker/runtime/tp_fixture.h"

namespace recall::runtime::tp {
namespace {

model::ModelConfig Stories() {
  model::ModelConfig c;
  c.dim = 64;
  c.hidden_dim = 172;
  c.n_layers = 5;
  c.n_heads = 8;
  c.n_kv_heads = 4;
  c.head_dim = 8;
  c.vocab_size = 512;
  c.max_seq_len = 512;
  return c;
}

TEST(TpLayout, SplitsHeadsAndMlpEvenly) {
  auto l = MakeTpLayout(Stories(), 2, 1);
  ASSERT_TRUE(l.ok()) << l.status();
  EXPECT_EQ(l->q_heads, 4);
  EXPECT_EQ(l->q_head_offset, 4);
  EXPECT_EQ(l->kv_heads, 2);
  EXPECT_EQ(l->kv_head_offset, 2);
  EXPECT_EQ(l->hidden, 86);
  EXPECT_EQ(l->hidden_offset, 86);
}

TEST(TpLayout, ReplicatesKvHeadsPastTheirCount) {
  model::ModelConfig c = Stories();
  c.hidden_dim = 176;  // divisible by 8
  for (int r = 0; r < 8; ++r) {
    auto l = MakeTpLayout(c, 8, r);
    ASSERT_TRUE(l.ok()) << l.status();
    EXPECT_EQ(l->q_heads, 1);
    EXPECT_EQ(l->kv_heads, 1);
    EXPECT_EQ(l->kv_head_offset, r / 2) << "rank " << r;  // query head r uses KV head r / 2
  }
}

TEST(TpLayout, RejectsSplitsTheModelDoesNotAllow) {
  const model::ModelConfig c = Stories();
  auto three = MakeTpLayout(c, 3, 0);
  EXPECT_EQ(three.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(three.status().message().find("8 query heads"), std::string::npos) << three.status();
  // 172 = 4 * 43: tp = 8 divides the heads but not the MLP width.
  auto eight = MakeTpLayout(c, 8, 0);
  EXPECT_NE(eight.status().message().find("hidden_dim = 172"), std::string::npos) << eight.status();
  EXPECT_EQ(MakeTpLayout(c, 0, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeTpLayout(c, 2, 2).status().code(), absl::StatusCode::kInvalidArgument);
}

class ShardTest : public TpFixture {};

TEST_F(ShardTest, ShardsViewTheirRowsAndCopyTheirColumns) {
  const model::Model& full = *model_;
  auto shard = ShardModel(full, 4, 3);
  ASSERT_TRUE(shard.ok()) << shard.status();
  const model::Model& s = **shard;
  EXPECT_EQ(s.config.n_heads, 2);
  EXPECT_EQ(s.config.n_kv_heads, 1);
  EXPECT_EQ(s.config.hidden_dim, 43);
  const int hd = full.config.head_dim, dim = full.config.dim;
  const model::LayerWeights& fw = full.layers[2];
  const model::LayerWeights& sw = s.layers[2];
  // wq rows of query heads 6 and 7: a view into the full weights.
  EXPECT_EQ(sw.wq.rows, 2 * hd);
  EXPECT_EQ(sw.wq.f32(), fw.wq.f32() + static_cast<int64_t>(6) * hd * dim);
  EXPECT_EQ(sw.wk.f32(), fw.wk.f32() + static_cast<int64_t>(3) * hd * dim);
  // wo columns [6 * hd, 8 * hd): copied.
  ASSERT_EQ(sw.wo.rows, dim);
  ASSERT_EQ(sw.wo.cols, 2 * hd);
  for (int r = 0; r < dim; ++r) {
    for (int c = 0; c < 2 * hd; ++c) {
      ASSERT_EQ(sw.wo.f32()[r * 2 * hd + c], fw.wo.f32()[r * fw.wo.cols + 6 * hd + c]);
    }
  }
  // w_down columns [129, 172).
  for (int r = 0; r < dim; ++r) {
    for (int c = 0; c < 43; ++c) {
      ASSERT_EQ(sw.w_down.f32()[r * 43 + c], fw.w_down.f32()[r * 172 + 129 + c]);
    }
  }
  EXPECT_EQ(s.lm_head.data, full.lm_head.data);  // replicated
}

}  // namespace
}  // namespace recall::runtime::tp
