// FP8 weights kept as E4M3 (LoadOptions::weight_dtype "fp8", worker/model/fp8.h) on the real
// stories260K written as an FP8 checkpoint by tools/convert_llama2c_to_hf.py: the loader keeps
// every linear weight, a model that is not FP8 is quantized at load, an engine on CPU ranks
// refuses them by field (only CUDA multiplies FP8), and tensor-parallel shards keep the
// scales of their blocks (or are refused, naming tp, when a shard starts inside a block).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "kernels/fp8.h"
#include "tests/common/stories260k.h"
#include "tests/common/test_util.h"
#include "worker/model/load.h"
#include "worker/runtime/engine.h"
#include "worker/runtime/tp/shard.h"

namespace recall::runtime {
namespace {

class Fp8WeightsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    RECALL_REQUIRE_SHARED_FILE(testing::kStoriesModel);
    dir_ = testing::MakeTempDir("fp8_weights");
  }
  void TearDown() override {
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  // stories260K as an FP8 checkpoint with blocks of `block` x `block`, loaded with
  // weight_dtype `weight_dtype`.
  absl::StatusOr<model::Loaded> Load(int block, const std::string& weight_dtype) {
    const std::string out = absl::StrCat(dir_, "/fp8_", block);
    if (!std::filesystem::exists(out)) {
      const std::string cmd =
          absl::StrCat("python3 ", testing::SourcePath("tools/convert_llama2c_to_hf.py"), " ",
                       testing::SharedPath(testing::kStoriesModel), " ", out,
                       " --dtype fp8 --fp8-block ", block, " > /dev/null");
      if (std::system(cmd.c_str()) != 0) return absl::InternalError(cmd);
    }
    model::LoadOptions o;
    o.model = out;
    o.tokenizer = testing::SharedPath(testing::kStoriesTokenizer);
    o.weight_dtype = weight_dtype;
    return model::LoadAll(o);
  }

  // Weight [r, c] of an FP8 matrix: its code's value times its row's and block's scale.
  static float Value(const kernels::Matrix& m, int64_t r, int64_t c) {
    const uint8_t code = static_cast<const uint8_t*>(m.data)[r * m.cols + c];
    return kernels::E4M3ToF32(code) * m.scales[r * m.ScaleColumns() + c / m.scale_block];
  }

  std::string dir_;
};

TEST_F(Fp8WeightsTest, KeptOnLoadAndRefusedByCpuRanksByField) {
  auto loaded = Load(32, "fp8");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const model::Model& m = *loaded->model;
  EXPECT_EQ(m.config.weight_dtype, kernels::DType::kF8E4M3);
  for (const model::LayerWeights& l : m.layers) {
    for (const kernels::Matrix* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) {
      EXPECT_EQ(w->dtype, kernels::DType::kF8E4M3);
      EXPECT_EQ(w->scale_block, 32);
    }
  }
  EXPECT_EQ(m.tok_embeddings.dtype, kernels::DType::kBF16);
  EngineOptions o;
  o.kv_cache_bytes = int64_t{8} << 20;
  auto engine = Engine::Create(m, o);
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(engine.status().message().find("weight_dtype: fp8: this device (cpu) does not "
                                           "multiply FP8 weights"),
            std::string::npos)
      << engine.status();
  // The same checkpoint widened (auto) runs on the CPU.
  auto widened = Load(32, "auto");
  ASSERT_TRUE(widened.ok()) << widened.status();
  EXPECT_EQ(widened->model->config.weight_dtype, kernels::DType::kBF16);
  EXPECT_TRUE(Engine::Create(*widened->model, o).ok());
}

// Any other model is quantized at load: each linear weight within E4M3's rounding of the f32
// original (half a step, 1/16 of the value for normals; 2^-10 of the block's scale below)
// under one scale per row and block of 128 columns; the LM head and embeddings stay f32.
TEST_F(Fp8WeightsTest, AModelThatIsNotFp8IsQuantizedAtLoad) {
  model::LoadOptions o;
  o.model = testing::SharedPath(testing::kStoriesModel);
  o.tokenizer = testing::SharedPath(testing::kStoriesTokenizer);
  auto f32 = model::LoadAll(o);
  o.weight_dtype = "fp8";
  auto fp8 = model::LoadAll(o);
  ASSERT_TRUE(f32.ok()) << f32.status();
  ASSERT_TRUE(fp8.ok()) << fp8.status();
  EXPECT_EQ(fp8->model->config.weight_dtype, kernels::DType::kF8E4M3);
  EXPECT_EQ(fp8->model->lm_head.dtype, kernels::DType::kF32);
  for (size_t l = 0; l < f32->model->layers.size(); ++l) {
    const model::LayerWeights& a = f32->model->layers[l];
    const model::LayerWeights& b = fp8->model->layers[l];
    for (const auto& [x, y] : {std::pair{&a.wq, &b.wq}, {&a.wo, &b.wo}, {&a.w_down, &b.w_down}}) {
      ASSERT_EQ(y->dtype, kernels::DType::kF8E4M3);
      ASSERT_EQ(y->scale_block, 128);
      for (int64_t r = 0; r < x->rows; ++r) {
        for (int64_t c = 0; c < x->cols; ++c) {
          const float want = x->f32()[r * x->cols + c];
          const float scale = y->scales[r * y->ScaleColumns() + c / 128];
          const float bound = std::max(std::fabs(want) / 16.0f, scale * std::ldexp(1.0f, -10));
          ASSERT_LE(std::fabs(Value(*y, r, c) - want), bound * 1.0001f)
              << l << " " << r << " " << c;
        }
      }
    }
  }
}

// Blocks of 256 cover each of stories260K's matrices whole (one scale per row), so every
// shard is valid; each shard's weights are the full matrix's at the shard's rows or columns.
TEST_F(Fp8WeightsTest, ShardsKeepTheirBlocksScales) {
  auto loaded = Load(256, "fp8");
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  const model::Model& full = *loaded->model;
  const int hd = full.config.head_dim;
  for (int rank = 0; rank < 2; ++rank) {
    auto shard = tp::ShardModel(full, 2, rank);
    ASSERT_TRUE(shard.ok()) << shard.status();
    for (size_t l = 0; l < full.layers.size(); ++l) {
      const model::LayerWeights& f = full.layers[l];
      const model::LayerWeights& s = (*shard)->layers[l];
      const int64_t q0 = int64_t{rank} * (*shard)->config.n_heads * hd;
      const int64_t h0 = int64_t{rank} * (*shard)->config.hidden_dim;
      for (int64_t r = 0; r < s.wq.rows; ++r) {
        for (int64_t c = 0; c < s.wq.cols; ++c)
          ASSERT_EQ(Value(s.wq, r, c), Value(f.wq, q0 + r, c));
      }
      for (int64_t r = 0; r < s.w_down.rows; ++r) {
        for (int64_t c = 0; c < s.w_down.cols; ++c) {
          ASSERT_EQ(Value(s.w_down, r, c), Value(f.w_down, r, h0 + c)) << r << ", " << c;
        }
      }
      for (int64_t r = 0; r < s.wo.rows; ++r) {
        for (int64_t c = 0; c < s.wo.cols; ++c)
          ASSERT_EQ(Value(s.wo, r, c), Value(f.wo, r, q0 + c));
      }
    }
  }
  // Blocks of 32: rank 1's columns of down_proj [64, 172] start at 86, inside a block.
  auto blocks = Load(32, "fp8");
  ASSERT_TRUE(blocks.ok()) << blocks.status();
  auto refused = tp::ShardModel(*blocks->model, 2, 1);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("tp: a rank's columns of an FP8 weight [64, 172] "
                                            "start at column 86, inside a block of 32"),
            std::string::npos)
      << refused.status();
}

}  // namespace
}  // namespace recall::runtime
