// LoadLlama2c on the real stories260K checkpoint, a synthetic untied checkpoint, and
// truncated / corrupted copies.
#include <climits>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/common/test_util.h"
#include "tests/worker/model/test_files.h"
#include "worker/model/loader.h"

namespace recall::model {
namespace {

constexpr char kStories[] = "models/stories260K/stories260K.bin";

bool Contains(const absl::Status& s, const std::string& needle) {
  return s.message().find(needle) != absl::string_view::npos;
}

// A llama2.c file whose k-th weight float is k (so every view's first value is its offset).
std::string SyntheticCheckpoint(const std::vector<int32_t>& header, int64_t floats) {
  std::string out(reinterpret_cast<const char*>(header.data()), header.size() * 4);
  for (int64_t k = 0; k < floats; ++k) {
    const float f = static_cast<float>(k);
    out.append(reinterpret_cast<const char*>(&f), 4);
  }
  return out;
}

class Llama2cLoaderTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::MakeTempDir("llama2c_loader"); }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

TEST_F(Llama2cLoaderTest, LoadsStories260KConfigAndViews) {
  RECALL_REQUIRE_SHARED_FILE(kStories);
  const std::string path = testing::SharedPath(kStories);
  auto m = LoadLlama2c(path);
  ASSERT_TRUE(m.ok()) << m.status();
  const Model& model = **m;
  const ModelConfig& c = model.config;
  EXPECT_EQ(c.arch, Arch::kLlama);
  EXPECT_EQ(c.dim, 64);
  EXPECT_EQ(c.hidden_dim, 172);
  EXPECT_EQ(c.n_layers, 5);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.n_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.max_seq_len, 512);
  EXPECT_TRUE(c.tied_embeddings);
  EXPECT_FALSE(c.qkv_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_EQ(c.rope_style, kernels::RopeStyle::kInterleaved);
  EXPECT_EQ(c.rope_theta, 10000.0f);
  EXPECT_EQ(c.norm_eps, 1e-5f);
  EXPECT_EQ(c.weight_dtype, kernels::DType::kF32);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_id, 2);
  EXPECT_EQ(model.source, path);
  EXPECT_EQ(model.lm_head.data, model.tok_embeddings.data);
  ASSERT_EQ(model.layers.size(), 5u);
  EXPECT_EQ(model.layers[4].wk.rows, 32);
  EXPECT_EQ(model.layers[4].w_down.rows, 64);
  EXPECT_EQ(model.layers[4].w_down.cols, 172);
  // Views point into the file: compare against the bytes at the llama2.c offsets.
  const std::string bytes = testing::ReadFileOrEmpty(path);
  const auto at = [&](int64_t float_offset) { return bytes.data() + 28 + float_offset * 4; };
  EXPECT_EQ(std::memcmp(model.tok_embeddings.data, at(0), 512 * 64 * 4), 0);
  const int64_t layer_block = 5 * (64 + 2 * 64 * 64 + 2 * 32 * 64 + 64 + 3 * 172 * 64);
  EXPECT_EQ(std::memcmp(model.final_norm.data, at(512 * 64 + layer_block), 64 * 4), 0);
  // w3 (up) of the last layer ends right before rms_final.
  EXPECT_EQ(
      std::memcmp(model.layers[4].w_up.data, at(512 * 64 + layer_block - 172 * 64), 172 * 64 * 4),
      0);
}

TEST_F(Llama2cLoaderTest, SyntheticUntiedCheckpointMapsEveryWeightInOrder) {
  // dim 8, hidden 12, 2 layers, 2 heads, 1 kv head (kv_dim 4), vocab -10 (untied), seq 4.
  const int64_t D = 8, H = 12, L = 2, KV = 4, V = 10, freq = 4 * 4 / 2;
  const int64_t floats =
      V * D + L * (D + D * D + 2 * KV * D + D * D + D + 3 * H * D) + D + 2 * freq + V * D;
  const std::string path = dir_ + "/tiny.bin";
  test::WriteFile(path, SyntheticCheckpoint({8, 12, 2, 2, 1, -10, 4}, floats));
  auto m = LoadModel(path);  // a file: dispatched to the llama2.c loader
  ASSERT_TRUE(m.ok()) << m.status();
  const Model& model = **m;
  EXPECT_FALSE(model.config.tied_embeddings);
  EXPECT_EQ(model.config.vocab_size, 10);
  EXPECT_EQ(model.config.head_dim, 4);
  int64_t off = 0;
  auto expect_at = [&](const kernels::Matrix& mat, int64_t rows, int64_t cols, const char* what) {
    EXPECT_EQ(mat.rows, rows) << what;
    EXPECT_EQ(mat.cols, cols) << what;
    EXPECT_EQ(mat.f32()[0], static_cast<float>(off)) << what;
    EXPECT_EQ(mat.f32()[rows * cols - 1], static_cast<float>(off + rows * cols - 1)) << what;
    off += rows * cols;
  };
  expect_at(model.tok_embeddings, V, D, "tok_embeddings");
  for (int l = 0; l < L; ++l) expect_at(model.layers[l].attn_norm, 1, D, "rms_att");
  for (int l = 0; l < L; ++l) expect_at(model.layers[l].wq, D, D, "wq");
  for (int l = 0; l < L; ++l) expect_at(model.layers[l].wk, KV, D, "wk");
  for (int l = 0; l < L; ++l) expect_at(model.layers[l].wv, KV, D, "wv");
  for (int l = 0; l < L; ++l) expect_at(model.layers[l].wo, D, D, "wo");
  for (int l = 0; l < L; ++l) expect_at(model.layers[l].ffn_norm, 1, D, "rms_ffn");
  for (int l = 0; l < L; ++l) expect_at(model.layers[l].w_gate, H, D, "w1");
  for (int l = 0; l < L; ++l) expect_at(model.layers[l].w_down, D, H, "w2");
  for (int l = 0; l < L; ++l) expect_at(model.layers[l].w_up, H, D, "w3");
  expect_at(model.final_norm, 1, D, "rms_final");
  off += 2 * freq;
  expect_at(model.lm_head, V, D, "wcls");
  EXPECT_EQ(off, floats);
}

// A NaN or infinity in any weight made every reply garbage without an error (the embedding
// table's NaN gave "<unk><unk>..."): refused, naming run.c's field, the layer and the element.
TEST_F(Llama2cLoaderTest, ANonFiniteWeightIsRefusedNamingTheTensorAndElement) {
  const std::vector<int32_t> header = {8, 12, 2, 2, 1, -10, 4};
  const std::string clean = test::Llama2cCheckpoint(header);
  test::WriteFile(dir_ + "/clean.bin", clean);
  ASSERT_TRUE(LoadLlama2c(dir_ + "/clean.bin").ok());
  const int64_t D = 8, V = 10, KV = 4;
  struct Case {
    int64_t float_index;
    float value;
    const char* want;
  };
  const int64_t wk_layer1 = V * D + 2 * D + 2 * D * D + KV * D;  // wk of layer 1 starts here
  const int64_t wcls = test::Llama2cFloats(header) - V * D;
  for (const Case& c :
       {Case{3, NAN, "tensor \"token_embedding_table\": weight [0, 3] is nan"},
        Case{wk_layer1 + D + 2, INFINITY, "\"wk of layer 1\": weight [1, 2] is inf"},
        Case{wcls + V * D - 1, -INFINITY, "\"wcls\": weight [9, 7] is -inf"}}) {
    std::string bytes = clean;
    std::memcpy(&bytes[28 + 4 * c.float_index], &c.value, 4);
    const std::string path = dir_ + "/bad.bin";
    test::WriteFile(path, bytes);
    auto m = LoadModel(path);
    ASSERT_FALSE(m.ok()) << c.want;
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << m.status();
    EXPECT_TRUE(Contains(m.status(), path + ": ")) << m.status();
    EXPECT_TRUE(Contains(m.status(), c.want)) << m.status();
  }
}

TEST_F(Llama2cLoaderTest, TruncatedCopiesAreDataLossNamingTheFile) {
  RECALL_REQUIRE_SHARED_FILE(kStories);
  const std::string bytes = testing::ReadFileOrEmpty(testing::SharedPath(kStories));
  ASSERT_EQ(bytes.size(), 1056540u);
  for (size_t cut : {size_t{0}, size_t{3}, size_t{27}, size_t{28}, size_t{4096}, bytes.size() / 2,
                     bytes.size() - 1}) {
    const std::string path = dir_ + "/cut_" + std::to_string(cut) + ".bin";
    test::WriteFile(path, bytes.substr(0, cut));
    auto m = LoadLlama2c(path);
    ASSERT_FALSE(m.ok()) << cut;
    EXPECT_EQ(m.status().code(), absl::StatusCode::kDataLoss) << m.status();
    EXPECT_TRUE(Contains(m.status(), path)) << m.status();
    EXPECT_TRUE(Contains(m.status(), "file has " + std::to_string(cut) + " bytes")) << m.status();
    if (cut >= 28) {
      EXPECT_TRUE(Contains(m.status(), "implies 1056540 bytes")) << m.status();
    } else {
      EXPECT_TRUE(Contains(m.status(), "28-byte header")) << m.status();
    }
  }
}

TEST_F(Llama2cLoaderTest, CorruptedHeaderFieldsAreInvalidArgumentNamingTheField) {
  struct Case {
    int index;
    int32_t value;
    const char* field;
  };
  const Case cases[] = {
      {0, 0, "dim"},
      {0, -64, "dim"},
      {0, 1 << 20, "dim"},
      {1, 0, "hidden_dim"},
      {1, INT_MIN, "hidden_dim"},
      {2, 0, "n_layers"},
      {2, 100000, "n_layers"},
      {3, 0, "n_heads"},
      {3, 3, "n_heads"},
      {3, 128, "n_heads"},
      {3, 64, "n_heads"},
      {4, 0, "n_kv_heads"},
      {4, 3, "n_kv_heads"},
      {4, 16, "n_kv_heads"},
      {5, 0, "vocab_size"},
      {5, INT_MIN, "vocab_size"},
      {6, 0, "seq_len"},
      {6, -1, "seq_len"},
  };
  // n_heads 64 gives an odd head size of 1.
  for (const Case& k : cases) {
    std::vector<int32_t> header = {64, 172, 5, 8, 4, 512, 512};
    header[k.index] = k.value;
    const std::string path = dir_ + "/bad_header.bin";
    test::WriteFile(path, SyntheticCheckpoint(header, 16));
    auto m = LoadLlama2c(path);
    ASSERT_FALSE(m.ok()) << k.field << "=" << k.value;
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << m.status();
    EXPECT_TRUE(Contains(m.status(), std::string("header field ") + k.field)) << m.status();
    EXPECT_TRUE(Contains(m.status(), path)) << m.status();
  }
}

TEST_F(Llama2cLoaderTest, HugeButValidHeaderIsDataLossWithoutOverflow) {
  // Largest accepted values: the implied size (~2^51 bytes) must not overflow.
  const std::string path = dir_ + "/huge.bin";
  test::WriteFile(
      path, SyntheticCheckpoint({1 << 16, 1 << 20, 1024, 1024, 1024, -(1 << 24), 1 << 24}, 4));
  auto m = LoadLlama2c(path);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kDataLoss) << m.status();
  EXPECT_TRUE(Contains(m.status(), "file has 44 bytes")) << m.status();
}

// Issue 27: stories260K with vocab_size 1, 8 or -1 in its header loaded (the file is longer
// than such a header implies), then `recall generate` crashed on its first encode.
TEST_F(Llama2cLoaderTest, Stories260KWithAWrongVocabSizeIsDataLossNamingIt) {
  RECALL_REQUIRE_SHARED_FILE(kStories);
  const std::string bytes = testing::ReadFileOrEmpty(testing::SharedPath(kStories));
  for (int32_t vocab : {1, 8, -1, 511, 513, -512}) {
    std::string bad = bytes;
    std::memcpy(bad.data() + 5 * 4, &vocab, 4);
    const std::string path = dir_ + "/vocab_" + std::to_string(vocab) + ".bin";
    test::WriteFile(path, bad);
    auto m = LoadLlama2c(path);
    ASSERT_FALSE(m.ok()) << vocab;
    EXPECT_EQ(m.status().code(), absl::StatusCode::kDataLoss) << m.status();
    EXPECT_TRUE(Contains(m.status(), path)) << m.status();
    EXPECT_TRUE(Contains(m.status(), "header field vocab_size = " + std::to_string(vocab) +
                                         " is likely wrong: vocab_size = 512 (tied)"))
        << m.status();
    EXPECT_TRUE(Contains(m.status(), "file has 1056540 bytes")) << m.status();
  }
}

TEST_F(Llama2cLoaderTest, SyntheticCheckpointWithAWrongVocabSizeIsDataLossNamingIt) {
  const std::vector<int32_t> good = {8, 12, 2, 2, 1, 16, 4};
  const std::string bytes = test::Llama2cCheckpoint(good);
  const std::string path = dir_ + "/tiny.bin";
  test::WriteFile(path, bytes);
  ASSERT_TRUE(LoadLlama2c(path).ok());
  for (int32_t vocab : {1, 8, -1, 15, 17, -16}) {
    std::string bad = bytes;
    std::memcpy(bad.data() + 5 * 4, &vocab, 4);
    test::WriteFile(path, bad);
    auto m = LoadLlama2c(path);
    ASSERT_FALSE(m.ok()) << vocab;
    EXPECT_EQ(m.status().code(), absl::StatusCode::kDataLoss) << m.status();
    EXPECT_TRUE(Contains(m.status(), path)) << m.status();
    EXPECT_TRUE(Contains(m.status(), "vocab_size = 16 (tied)")) << m.status();
  }
}

TEST_F(Llama2cLoaderTest, EveryOtherDimensionThatDisagreesWithTheFileIsDataLoss) {
  // In range and self-consistent, but not the dimensions the file was written with.
  const std::vector<int32_t> good = {8, 12, 2, 2, 1, 16, 4};
  const std::string bytes = test::Llama2cCheckpoint(good);
  const std::string path = dir_ + "/tiny.bin";
  const struct {
    int index;
    int32_t value;
  } cases[] = {{0, 16}, {0, 4}, {1, 13}, {1, 11}, {2, 1}, {2, 3}, {3, 1}, {4, 2}, {6, 2}, {6, 6}};
  for (const auto& c : cases) {
    std::string bad = bytes;
    std::memcpy(bad.data() + c.index * 4, &c.value, 4);
    test::WriteFile(path, bad);
    auto m = LoadLlama2c(path);
    ASSERT_FALSE(m.ok()) << c.index << "=" << c.value;
    EXPECT_EQ(m.status().code(), absl::StatusCode::kDataLoss) << m.status();
    EXPECT_TRUE(Contains(m.status(), path)) << m.status();
    EXPECT_TRUE(Contains(m.status(), "implies")) << m.status();
  }
}

TEST_F(Llama2cLoaderTest, TrailingBytesAreDataLoss) {
  const std::string path = dir_ + "/tiny.bin";
  test::WriteFile(path, test::Llama2cCheckpoint({8, 12, 2, 2, 1, -16, 4}) + std::string(4, '\0'));
  auto m = LoadLlama2c(path);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kDataLoss) << m.status();
  EXPECT_TRUE(Contains(m.status(), "4 bytes longer than its header allows")) << m.status();
}

TEST_F(Llama2cLoaderTest, MissingFileIsNotFoundNamingThePath) {
  const std::string path = dir_ + "/does_not_exist.bin";
  auto m = LoadLlama2c(path);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound) << m.status();
  EXPECT_TRUE(Contains(m.status(), path)) << m.status();
  auto m2 = LoadModel(path);
  EXPECT_EQ(m2.status().code(), absl::StatusCode::kNotFound) << m2.status();
}

}  // namespace
}  // namespace recall::model
