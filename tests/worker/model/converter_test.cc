// tools/convert_llama2c_to_hf.py on stories260K: the Hugging Face directory it writes loads
// to the same model as the llama2.c checkpoint, with q/k rows permuted for half-split RoPE.
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"
#include "worker/model/half.h"
#include "worker/model/loader.h"

namespace recall::model {
namespace {

constexpr char kStories[] = "models/stories260K/stories260K.bin";

float At(const kernels::Matrix& m, int64_t row, int64_t col) {
  return LoadAsF32(m.data, m.dtype, row * m.cols + col);
}

float Round(float v, kernels::DType dtype) {
  switch (dtype) {
    case kernels::DType::kF32:
      return v;
    case kernels::DType::kF16:
      return F16ToF32(F32ToF16(v));
    case kernels::DType::kBF16:
      return Bf16ToF32(F32ToBf16(v));
    case kernels::DType::kI8:  // not a file type
    case kernels::DType::kF8E4M3:
      break;
  }
  return v;
}

// Expects hf == llama2c rounded to `file_dtype` (the converter writes every tensor, norms
// included, in that dtype), element by element; `permute_heads` > 0 applies the documented
// row permutation within each head of that many heads.
void ExpectConverted(const kernels::Matrix& hf, const kernels::Matrix& l2c, int permute_heads,
                     kernels::DType file_dtype, const std::string& what) {
  ASSERT_EQ(hf.rows, l2c.rows) << what;
  ASSERT_EQ(hf.cols, l2c.cols) << what;
  const int64_t hd = permute_heads > 0 ? hf.rows / permute_heads : 0;
  for (int64_t r = 0; r < hf.rows; ++r) {
    int64_t src = r;
    if (permute_heads > 0) {
      const int64_t head = r / hd, j = r % hd;
      src = head * hd + (j < hd / 2 ? 2 * j : 2 * (j - hd / 2) + 1);
    }
    for (int64_t c = 0; c < hf.cols; ++c) {
      ASSERT_EQ(At(hf, r, c), Round(At(l2c, src, c), file_dtype))
          << what << " row " << r << " (llama2.c row " << src << ") col " << c;
    }
  }
}

std::vector<float> MatVec(const kernels::Matrix& m, const std::vector<float>& x) {
  std::vector<float> y(m.rows);
  for (int64_t r = 0; r < m.rows; ++r) {
    double s = 0;
    for (int64_t c = 0; c < m.cols; ++c) s += At(m, r, c) * x[c];
    y[r] = static_cast<float>(s);
  }
  return y;
}

// RoPE on one head in place, for either layout.
void Rope(float* v, int hd, int pos, kernels::RopeStyle style) {
  for (int i = 0; i < hd / 2; ++i) {
    const double angle = pos * std::pow(10000.0, -2.0 * i / hd);
    const int a = style == kernels::RopeStyle::kInterleaved ? 2 * i : i;
    const int b = style == kernels::RopeStyle::kInterleaved ? 2 * i + 1 : i + hd / 2;
    const double x = v[a], y = v[b];
    v[a] = static_cast<float>(x * std::cos(angle) - y * std::sin(angle));
    v[b] = static_cast<float>(x * std::sin(angle) + y * std::cos(angle));
  }
}

// Attention scores q_h(pos_q) . k_g(pos_k) for every query head, under the model's RoPE.
std::vector<double> Scores(const Model& m, int layer, const std::vector<float>& x) {
  const ModelConfig& c = m.config;
  std::vector<float> q = MatVec(m.layers[layer].wq, x), k = MatVec(m.layers[layer].wk, x);
  std::vector<double> scores;
  for (int h = 0; h < c.n_heads; ++h) {
    std::vector<float> qh(q.begin() + h * c.head_dim, q.begin() + (h + 1) * c.head_dim);
    const int g = h / (c.n_heads / c.n_kv_heads);
    std::vector<float> kh(k.begin() + g * c.head_dim, k.begin() + (g + 1) * c.head_dim);
    Rope(qh.data(), c.head_dim, 37, c.rope_style);
    Rope(kh.data(), c.head_dim, 5, c.rope_style);
    double s = 0;
    for (int i = 0; i < c.head_dim; ++i) s += static_cast<double>(qh[i]) * kh[i];
    scores.push_back(s);
  }
  return scores;
}

class ConverterTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::MakeTempDir("converter"); }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::unique_ptr<Model> Convert(const std::string& flags) {
    const std::string cmd =
        absl::StrCat("python3 ", testing::SourcePath("tools/convert_llama2c_to_hf.py"), " ",
                     testing::SharedPath(kStories), " ", dir_, " ", flags, " > /dev/null");
    EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
    auto m = LoadHuggingFace(dir_);
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? std::move(*m) : nullptr;
  }

  void ExpectSameModel(const Model& hf, const Model& l2c, kernels::DType dtype) {
    ModelConfig expected = l2c.config;
    expected.rope_style = kernels::RopeStyle::kHalfSplit;
    expected.weight_dtype = dtype;
    const ModelConfig& c = hf.config;
    EXPECT_EQ(c.arch, expected.arch);
    EXPECT_EQ(c.dim, expected.dim);
    EXPECT_EQ(c.hidden_dim, expected.hidden_dim);
    EXPECT_EQ(c.n_layers, expected.n_layers);
    EXPECT_EQ(c.n_heads, expected.n_heads);
    EXPECT_EQ(c.n_kv_heads, expected.n_kv_heads);
    EXPECT_EQ(c.head_dim, expected.head_dim);
    EXPECT_EQ(c.vocab_size, expected.vocab_size);
    EXPECT_EQ(c.max_seq_len, expected.max_seq_len);
    EXPECT_EQ(c.rope_theta, expected.rope_theta);
    EXPECT_EQ(c.norm_eps, expected.norm_eps);
    EXPECT_EQ(c.rope_style, expected.rope_style);
    EXPECT_EQ(c.tied_embeddings, expected.tied_embeddings);
    EXPECT_EQ(c.qkv_bias, expected.qkv_bias);
    EXPECT_EQ(c.qk_norm, expected.qk_norm);
    EXPECT_EQ(c.weight_dtype, expected.weight_dtype);
    EXPECT_EQ(c.bos_token_id, expected.bos_token_id);
    EXPECT_EQ(c.eos_token_id, expected.eos_token_id);

    ExpectConverted(hf.tok_embeddings, l2c.tok_embeddings, 0, dtype, "embeddings");
    EXPECT_EQ(hf.lm_head.data, hf.tok_embeddings.data);
    ExpectConverted(hf.final_norm, l2c.final_norm, 0, dtype, "final_norm");
    for (int l = 0; l < c.n_layers; ++l) {
      const LayerWeights &a = hf.layers[l], &b = l2c.layers[l];
      const std::string at = absl::StrCat(" layer ", l);
      ExpectConverted(a.wq, b.wq, c.n_heads, dtype, "wq" + at);
      ExpectConverted(a.wk, b.wk, c.n_kv_heads, dtype, "wk" + at);
      ExpectConverted(a.wv, b.wv, 0, dtype, "wv" + at);
      ExpectConverted(a.wo, b.wo, 0, dtype, "wo" + at);
      ExpectConverted(a.w_gate, b.w_gate, 0, dtype, "gate" + at);
      ExpectConverted(a.w_up, b.w_up, 0, dtype, "up" + at);
      ExpectConverted(a.w_down, b.w_down, 0, dtype, "down" + at);
      ExpectConverted(a.attn_norm, b.attn_norm, 0, dtype, "attn_norm" + at);
      ExpectConverted(a.ffn_norm, b.ffn_norm, 0, dtype, "ffn_norm" + at);
    }
  }

  std::string dir_;
};

TEST_F(ConverterTest, F32SingleFileEqualsTheLlama2cModel) {
  RECALL_REQUIRE_SHARED_FILE(kStories);
  auto l2c = LoadLlama2c(testing::SharedPath(kStories));
  ASSERT_TRUE(l2c.ok()) << l2c.status();
  std::unique_ptr<Model> hf = Convert("");
  ASSERT_NE(hf, nullptr);
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/model.safetensors"));
  ExpectSameModel(*hf, **l2c, kernels::DType::kF32);

  // The permutation is the one that makes half-split RoPE scores equal interleaved ones.
  std::vector<float> x(64);
  for (int i = 0; i < 64; ++i) x[i] = std::sin(0.37f * i + 1.0f);
  for (int l = 0; l < 5; ++l) {
    const std::vector<double> a = Scores(*hf, l, x), b = Scores(**l2c, l, x);
    for (size_t h = 0; h < a.size(); ++h) {
      EXPECT_NEAR(a[h], b[h], 1e-4 * (1.0 + std::fabs(b[h]))) << "layer " << l << " head " << h;
    }
  }
}

TEST_F(ConverterTest, Bf16ShardedEqualsTheRoundedLlama2cModel) {
  RECALL_REQUIRE_SHARED_FILE(kStories);
  auto l2c = LoadLlama2c(testing::SharedPath(kStories));
  ASSERT_TRUE(l2c.ok()) << l2c.status();
  std::unique_ptr<Model> hf = Convert("--dtype bf16 --shards 3");
  ASSERT_NE(hf, nullptr);
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/model.safetensors"));
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/model.safetensors.index.json"));
  for (int i = 1; i <= 3; ++i) {
    EXPECT_TRUE(std::filesystem::exists(dir_ + "/model-0000" + std::to_string(i) +
                                        "-of-00003.safetensors"));
  }
  EXPECT_EQ(hf->layers[2].wq.dtype, kernels::DType::kBF16);
  ExpectSameModel(*hf, **l2c, kernels::DType::kBF16);
}

TEST_F(ConverterTest, F16SingleFileEqualsTheRoundedLlama2cModel) {
  RECALL_REQUIRE_SHARED_FILE(kStories);
  auto l2c = LoadLlama2c(testing::SharedPath(kStories));
  ASSERT_TRUE(l2c.ok()) << l2c.status();
  std::unique_ptr<Model> hf = Convert("--dtype f16");
  ASSERT_NE(hf, nullptr);
  ExpectSameModel(*hf, **l2c, kernels::DType::kF16);
}

}  // namespace
}  // namespace recall::model
