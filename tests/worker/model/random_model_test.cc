// MakeRandomModel and the fp16/bf16 scalar conversions it uses.
#include "worker/model/random_model.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "gtest/gtest.h"
#include "worker/model/half.h"

namespace recall::model {
namespace {

ModelConfig Tiny() {
  ModelConfig c;
  c.dim = 32;
  c.hidden_dim = 48;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 8;
  c.vocab_size = 50;
  c.max_seq_len = 64;
  return c;
}

float At(const kernels::Matrix& m, int64_t i) { return LoadAsF32(m.data, m.dtype, i); }

TEST(HalfTest, Bf16RoundsToNearestEven) {
  EXPECT_EQ(F32ToBf16(1.0f), 0x3f80);
  EXPECT_EQ(F32ToBf16(BitsFloat(0x3f808000u)), 0x3f80);  // tie, even stays
  EXPECT_EQ(F32ToBf16(BitsFloat(0x3f818000u)), 0x3f82);  // tie, odd rounds up
  EXPECT_EQ(F32ToBf16(BitsFloat(0x3f808001u)), 0x3f81);  // above the tie
  EXPECT_EQ(Bf16ToF32(0xc000), -2.0f);
  EXPECT_TRUE(std::isnan(Bf16ToF32(F32ToBf16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(HalfTest, F16RoundTripsAndRounds) {
  EXPECT_EQ(F32ToF16(1.0f), 0x3c00);
  EXPECT_EQ(F32ToF16(-2.0f), 0xc000);
  EXPECT_EQ(F32ToF16(65504.0f), 0x7bff);
  EXPECT_EQ(F32ToF16(65520.0f), 0x7c00);  // rounds to inf
  EXPECT_EQ(F32ToF16(1e-8f), 0x0000);
  EXPECT_EQ(F32ToF16(std::ldexp(1.0f, -24)), 0x0001);         // smallest subnormal
  EXPECT_EQ(F32ToF16(std::ldexp(3.0f, -25)), 0x0002);         // 1.5 subnormal ulps: tie to even
  EXPECT_EQ(F32ToF16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie to even
  EXPECT_EQ(F32ToF16(1.0f + std::ldexp(3.0f, -11)), 0x3c02);  // tie, odd rounds up
  for (uint32_t h = 0; h < 0x7c00; ++h) {  // every finite non-negative half round-trips
    ASSERT_EQ(F32ToF16(F16ToF32(static_cast<uint16_t>(h))), h) << h;
    ASSERT_EQ(F32ToF16(F16ToF32(static_cast<uint16_t>(h | 0x8000))), h | 0x8000) << h;
  }
  EXPECT_EQ(F16ToF32(0x0001), std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::isinf(F16ToF32(0x7c00)));
}

class RandomModelTest : public ::testing::TestWithParam<kernels::DType> {};

TEST_P(RandomModelTest, ShapesDtypesAndRange) {
  const kernels::DType dtype = GetParam();
  auto m = MakeRandomModel(Tiny(), dtype, 11);
  ASSERT_TRUE(m.ok()) << m.status();
  const Model& model = **m;
  EXPECT_EQ(model.config.weight_dtype, dtype);
  EXPECT_EQ(model.layers.size(), 2u);
  const LayerWeights& w = model.layers[1];
  EXPECT_EQ(w.wq.rows, 32);
  EXPECT_EQ(w.wk.rows, 16);
  EXPECT_EQ(w.wo.cols, 32);
  EXPECT_EQ(w.w_down.rows, 32);
  EXPECT_EQ(w.w_down.cols, 48);
  EXPECT_EQ(w.wq.dtype, dtype);
  EXPECT_EQ(w.attn_norm.dtype, kernels::DType::kF32);
  EXPECT_EQ(w.attn_norm.f32()[5], 1.0f);
  EXPECT_TRUE(w.bq.empty());
  EXPECT_TRUE(w.q_norm.empty());
  EXPECT_NE(model.lm_head.data, model.tok_embeddings.data);  // untied by default
  const float bound = 1.0f / std::sqrt(48.0f) * 1.01f;
  double sum_abs = 0;
  for (int64_t i = 0; i < w.w_down.numel(); ++i) {
    const float v = At(w.w_down, i);
    ASSERT_LE(std::fabs(v), bound);
    sum_abs += std::fabs(v);
  }
  EXPECT_GT(sum_abs / w.w_down.numel(), 0.3 / std::sqrt(48.0));  // not all zeros
}

TEST_P(RandomModelTest, DeterministicInSeed) {
  auto a = MakeRandomModel(Tiny(), GetParam(), 5);
  auto b = MakeRandomModel(Tiny(), GetParam(), 5);
  auto c = MakeRandomModel(Tiny(), GetParam(), 6);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  const kernels::Matrix& x = (*a)->layers[0].w_up;
  EXPECT_EQ(std::memcmp(x.data, (*b)->layers[0].w_up.data, x.bytes()), 0);
  EXPECT_NE(std::memcmp(x.data, (*c)->layers[0].w_up.data, x.bytes()), 0);
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, RandomModelTest,
                         ::testing::Values(kernels::DType::kF32, kernels::DType::kF16,
                                           kernels::DType::kBF16),
                         [](const auto& info) { return kernels::DTypeName(info.param); });

TEST(RandomModelTest, HonoursBiasNormAndTying) {
  ModelConfig c = Tiny();
  c.qkv_bias = true;
  c.qk_norm = true;
  c.tied_embeddings = true;
  auto m = MakeRandomModel(c, kernels::DType::kBF16, 1);
  ASSERT_TRUE(m.ok()) << m.status();
  const LayerWeights& w = (*m)->layers[0];
  ASSERT_FALSE(w.bq.empty());
  EXPECT_EQ(w.bk.cols, 16);
  EXPECT_EQ(w.bv.f32()[3], 0.0f);
  ASSERT_FALSE(w.k_norm.empty());
  EXPECT_EQ(w.q_norm.cols, 8);
  EXPECT_EQ(w.k_norm.f32()[7], 1.0f);
  EXPECT_EQ((*m)->lm_head.data, (*m)->tok_embeddings.data);
}

// The bytes a model's weights take, each matrix once (a tied head shares the embedding).
int64_t HeldBytes(const Model& m) {
  int64_t bytes = m.tok_embeddings.bytes() + m.final_norm.bytes();
  if (m.lm_head.data != m.tok_embeddings.data) bytes += m.lm_head.bytes();
  for (const LayerWeights& w : m.layers) {
    for (const kernels::Matrix* x :
         {&w.attn_norm, &w.wq, &w.wk, &w.wv, &w.wo, &w.bq, &w.bk, &w.bv, &w.q_norm, &w.k_norm,
          &w.ffn_norm, &w.w_gate, &w.w_up, &w.w_down}) {
      bytes += x->bytes();
    }
  }
  return bytes;
}

TEST(RandomModelTest, RandomModelBytesIsWhatTheModelHolds) {
  for (bool extras : {false, true}) {
    ModelConfig c = Tiny();
    c.qkv_bias = c.qk_norm = c.tied_embeddings = extras;
    for (kernels::DType dtype : {kernels::DType::kF32, kernels::DType::kBF16}) {
      auto m = MakeRandomModel(c, dtype, 1);
      ASSERT_TRUE(m.ok()) << m.status();
      EXPECT_EQ(RandomModelBytes(c, dtype), HeldBytes(**m)) << extras;
    }
  }
}

TEST(RandomModelTest, FillsHeadDimAndRejectsInvalidConfig) {
  ModelConfig c = Tiny();
  c.head_dim = 0;
  auto m = MakeRandomModel(c, kernels::DType::kF32, 1);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->config.head_dim, 8);
  c.n_kv_heads = 3;
  auto bad = MakeRandomModel(c, kernels::DType::kF32, 1);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace recall::model
