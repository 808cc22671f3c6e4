// FP8 checkpoints (worker/model/fp8.h): the E4M3 decoding, a synthetic checkpoint's weights
// widened block by block to exactly code value * scale, every malformed variant refused by
// name, and tools/convert_llama2c_to_hf.py --dtype fp8 on stories260K loading within FP8's
// rounding of the f32 weights.
#include "worker/model/fp8.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"
#include "tests/worker/model/test_files.h"
#include "worker/model/half.h"
#include "worker/model/loader.h"

namespace recall::model {
namespace {

using test::TinyHf;

TEST(Fp8, E4M3DecodesTheFormatsValues) {
  EXPECT_EQ(E4M3ToF32(0x00), 0.0f);
  EXPECT_EQ(E4M3ToF32(0x38), 1.0f);  // exponent 7 (bias 7), mantissa 0
  EXPECT_EQ(E4M3ToF32(0xB8), -1.0f);
  EXPECT_EQ(E4M3ToF32(0x3C), 1.5f);                  // mantissa 4/8
  EXPECT_EQ(E4M3ToF32(0x7E), 448.0f);                // the largest finite value
  EXPECT_EQ(E4M3ToF32(0x08), std::ldexp(1.0f, -6));  // the smallest normal
  EXPECT_EQ(E4M3ToF32(0x01), std::ldexp(1.0f, -9));  // the smallest subnormal
  EXPECT_EQ(E4M3ToF32(0x07), 7 * std::ldexp(1.0f, -9));
  EXPECT_TRUE(std::isnan(E4M3ToF32(0x7F)));
  EXPECT_TRUE(std::isnan(E4M3ToF32(0xFF)));
}

TEST(Fp8, E4M3EncodesToTheNearestCodeTiesToEven) {
  for (int c = 0; c < 256; ++c) {  // every finite code is its own value's code
    if ((c & 0x7F) == 0x7F) continue;
    EXPECT_EQ(kernels::F32ToE4M3(E4M3ToF32(static_cast<uint8_t>(c))), c) << c;
  }
  EXPECT_EQ(kernels::F32ToE4M3(1.0625f), 0x38);  // halfway 1 and 1.125: to mantissa 0
  EXPECT_EQ(kernels::F32ToE4M3(1.1875f), 0x3A);  // halfway 1.125 and 1.25: to mantissa 2
  EXPECT_EQ(kernels::F32ToE4M3(1.07f), 0x39);
  EXPECT_EQ(kernels::F32ToE4M3(std::ldexp(1.0f, -10)), 0x00);        // halfway 0 and 2^-9
  EXPECT_EQ(kernels::F32ToE4M3(1.5f * std::ldexp(1.0f, -9)), 0x02);  // halfway 1 and 2 (x 2^-9)
  EXPECT_EQ(kernels::F32ToE4M3(7.5f * std::ldexp(1.0f, -9)), 0x08);  // up to the smallest normal
  EXPECT_EQ(kernels::F32ToE4M3(464.0f), 0x7E);  // past 448 saturates, never NaN
  EXPECT_EQ(kernels::F32ToE4M3(-1e9f), 0xFE);
  EXPECT_EQ(kernels::F32ToE4M3(-0.0f), 0x80);
  EXPECT_EQ(kernels::F32ToE4M3(std::nanf("")), 0x7F);
}

class Fp8LoaderTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::MakeTempDir("fp8"); }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // The byte of weight element i of tensor `salt`, and block (br, bc)'s scale.
  static uint8_t Code(int salt, int64_t i) {
    const uint8_t c = static_cast<uint8_t>((salt * 37 + i * 11) % 255);
    return (c & 0x7F) == 0x7F ? 0x38 : c;  // no NaN
  }
  static float Scale(int salt, int64_t br, int64_t bc) {
    return 0.25f * static_cast<float>(1 + (salt + 3 * br + 5 * bc) % 7);
  }

  // TinyHf with every linear weight in E4M3 and scales over `block` in `scale_dtype` (real
  // checkpoints store them in float32 or bf16).
  test::SafetensorsWriter Fp8Tensors(const int (&block)[2],
                                     kernels::DType scale_dtype = kernels::DType::kF32) {
    test::SafetensorsWriter w = spec_.Tensors();
    int salt = 0;
    std::vector<std::pair<std::string, test::TestTensor>> scales;
    for (auto& [name, t] : w.tensors()) {
      if (name.find("_proj.weight") == std::string::npos) continue;
      const int64_t rows = t.shape[0], cols = t.shape[1];
      t.raw.clear();
      for (int64_t i = 0; i < rows * cols; ++i) t.raw.push_back(static_cast<char>(Code(salt, i)));
      t.raw_dtype = "F8_E4M3";
      test::TestTensor s;
      s.shape = {(rows + block[0] - 1) / block[0], (cols + block[1] - 1) / block[1]};
      for (int64_t br = 0; br < s.shape[0]; ++br) {
        for (int64_t bc = 0; bc < s.shape[1]; ++bc) s.values.push_back(Scale(salt, br, bc));
      }
      s.dtype = scale_dtype;
      scales.emplace_back(name + "_scale_inv", s);
      salts_[name] = salt++;
    }
    for (const auto& [name, s] : scales) w.Add(name, s);
    return w;
  }

  void WriteConfig(const std::string& quantization) {
    std::string j = spec_.ConfigJson();
    j.pop_back();
    test::WriteFile(dir_ + "/config.json", j + ",\"quantization_config\":" + quantization + "}");
  }

  absl::Status LoadError() {
    auto m = LoadModel(dir_);
    return m.ok() ? absl::OkStatus() : m.status();
  }

  TinyHf spec_;
  std::map<std::string, int> salts_;
  std::string dir_;
};

TEST_F(Fp8LoaderTest, WeightsAreWidenedToCodeTimesTheirBlocksScale) {
  spec_.dim = 8;
  spec_.hidden = 12;  // gate/up [12, 8] and down [8, 12]: partial blocks of 4 x 3
  const int block[2] = {4, 3};
  Fp8Tensors(block, kernels::DType::kBF16).Write(dir_ + "/model.safetensors");
  WriteConfig(R"({"quant_method":"fp8","fmt":"e4m3","activation_scheme":"dynamic",
                  "weight_block_size":[4,3]})");
  auto m = LoadModel(dir_);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE((*m)->config.fp8);
  EXPECT_EQ((*m)->config.weight_dtype, kernels::DType::kBF16);
  const LayerWeights& l = (*m)->layers[1];
  for (const auto& [name, w] : {std::pair<std::string, const kernels::Matrix*>{
                                    "model.layers.1.self_attn.q_proj.weight", &l.wq},
                                {"model.layers.1.mlp.gate_proj.weight", &l.w_gate},
                                {"model.layers.1.mlp.down_proj.weight", &l.w_down}}) {
    ASSERT_EQ(w->dtype, kernels::DType::kBF16) << name;
    const int salt = salts_.at(name);
    for (int64_t r = 0; r < w->rows; ++r) {
      for (int64_t c = 0; c < w->cols; ++c) {
        const float want = Bf16ToF32(F32ToBf16(E4M3ToF32(Code(salt, r * w->cols + c)) *
                                               Scale(salt, r / block[0], c / block[1])));
        ASSERT_EQ(LoadAsF32(w->data, w->dtype, r * w->cols + c), want)
            << name << " [" << r << ", " << c << "]";
      }
    }
  }
  // The embeddings and norms stay as stored.
  EXPECT_EQ((*m)->tok_embeddings.dtype, kernels::DType::kF32);
}

TEST_F(Fp8LoaderTest, OneScalePerTensorWithoutABlockSize) {
  const int per_tensor[2] = {1 << 20, 1 << 20};  // one block over any matrix
  Fp8Tensors(per_tensor).Write(dir_ + "/model.safetensors");
  WriteConfig(R"({"quant_method":"fp8"})");
  auto m = LoadModel(dir_);
  ASSERT_TRUE(m.ok()) << m.status();
  const kernels::Matrix& w = (*m)->layers[0].wk;
  const int salt = salts_.at("model.layers.0.self_attn.k_proj.weight");
  EXPECT_EQ(LoadAsF32(w.data, w.dtype, 5),
            Bf16ToF32(F32ToBf16(E4M3ToF32(Code(salt, 5)) * Scale(salt, 0, 0))));
}

TEST_F(Fp8LoaderTest, MalformedCheckpointsAreRefusedByName) {
  const int block[2] = {4, 4};
  const std::string config = R"({"quant_method":"fp8","weight_block_size":[4,4]})";
  const std::string q = "model.layers.0.self_attn.q_proj.weight";
  struct Case {
    std::string what;
    std::function<void(test::SafetensorsWriter&)> edit;
    std::string quantization;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"no scales", [&](auto& w) { w.tensors().erase(q + "_scale_inv"); }, config,
       q + "_scale_inv\" (the scales"},
      {"scales of the wrong shape",
       [&](auto& w) {
         w.tensors()[q + "_scale_inv"].shape = {1, 4};
       },
       config, "expected [2, 2]"},
      {"a negative scale", [&](auto& w) { w.tensors()[q + "_scale_inv"].values[1] = -1.0f; },
       config, "must be finite and positive"},
      {"a NaN weight", [&](auto& w) { w.tensors()[q].raw[9] = '\x7f'; }, config,
       "weight [1, 1] is NaN"},
      // Finite, but the weights it scales are not (they widened to infinities: <unk>s).
      {"a scale the weights overflow",
       [&](auto& w) { w.tensors()[q + "_scale_inv"].values[0] = 1e38f; }, config,
       "overflows (bf16 and f32 hold at most about 3.4e38): its _scale_inv is too large"},
      {"FP8 without quantization_config", [](auto&) {}, "null",
       "no quantization_config with quant_method \"fp8\""},
      {"an FP8 norm",
       [&](auto& w) {
         test::TestTensor& n = w.tensors()["model.layers.0.input_layernorm.weight"];
         n.raw = std::string(8, '\x38');
         n.raw_dtype = "F8_E4M3";
       },
       config, "which only linear weights may be"},
      {"another method", [](auto&) {}, R"({"quant_method":"gptq"})",
       "quantization_config.quant_method"},
      {"another format", [](auto&) {}, R"({"quant_method":"fp8","fmt":"e5m2"})",
       "quantization_config.fmt"},
      {"a bad block size", [](auto&) {}, R"({"quant_method":"fp8","weight_block_size":[0,4]})",
       "quantization_config.weight_block_size"},
  };
  for (const Case& c : cases) {
    test::SafetensorsWriter w = Fp8Tensors(block);
    c.edit(w);
    w.Write(dir_ + "/model.safetensors");
    WriteConfig(c.quantization);
    const absl::Status s = LoadError();
    EXPECT_FALSE(s.ok()) << c.what;
    EXPECT_NE(s.message().find(c.expect), std::string::npos) << c.what << ": " << s;
  }
}

// Kept as FP8 (weight_dtype fp8), a linear weight is the file's bytes with one scale per row
// and block of columns, each the scale of the row's block; rounded to bf16, code value times
// scale is exactly what the widening loader gives. The embeddings are widened either way.
TEST_F(Fp8LoaderTest, KeptWeightsAreTheBytesWithEachRowsBlockScales) {
  spec_.dim = 8;
  spec_.hidden = 12;  // down [8, 12]: a block of 8 columns and a partial one of 4
  const int block[2] = {4, 8};
  Fp8Tensors(block).Write(dir_ + "/model.safetensors");
  WriteConfig(R"({"quant_method":"fp8","weight_block_size":[4,8]})");
  auto kept = LoadModel(dir_, /*keep_fp8=*/true);
  auto widened = LoadModel(dir_);
  ASSERT_TRUE(kept.ok()) << kept.status();
  ASSERT_TRUE(widened.ok()) << widened.status();
  EXPECT_EQ((*kept)->config.weight_dtype, kernels::DType::kF8E4M3);
  EXPECT_NE((*kept)->tok_embeddings.dtype, kernels::DType::kF8E4M3);
  const LayerWeights& k = (*kept)->layers[1];
  const LayerWeights& w = (*widened)->layers[1];
  for (const auto& [name, km, wm] :
       {std::tuple<std::string, const kernels::Matrix*, const kernels::Matrix*>{
            "model.layers.1.self_attn.q_proj.weight", &k.wq, &w.wq},
        {"model.layers.1.mlp.down_proj.weight", &k.w_down, &w.w_down}}) {
    ASSERT_EQ(km->dtype, kernels::DType::kF8E4M3) << name;
    EXPECT_EQ(km->scale_block, 8);
    EXPECT_EQ(km->ScaleColumns(), (km->cols + 7) / 8);
    const int salt = salts_.at(name);
    const auto* bytes = static_cast<const uint8_t*>(km->data);
    for (int64_t r = 0; r < km->rows; ++r) {
      for (int64_t b = 0; b < km->ScaleColumns(); ++b) {
        EXPECT_EQ(km->scales[r * km->ScaleColumns() + b], Scale(salt, r / 4, b)) << name;
      }
      for (int64_t c = 0; c < km->cols; ++c) {
        const int64_t i = r * km->cols + c;
        ASSERT_EQ(bytes[i], Code(salt, i)) << name;
        const float value = E4M3ToF32(bytes[i]) * km->scales[r * km->ScaleColumns() + c / 8];
        ASSERT_EQ(kernels::F32ToBf16(value), static_cast<const uint16_t*>(wm->data)[i]) << name;
      }
    }
  }
}

// A scale per tensor is kept as one scale per row over the whole (8-rounded) width; blocks
// of columns that are not a multiple of 8 are refused by name when kept (the GPU reads 8
// columns under one scale) and widened otherwise.
TEST_F(Fp8LoaderTest, KeptScalesPerTensorAndBlocksOfOddWidths) {
  spec_.dim = 8;
  spec_.hidden = 12;
  const int per_tensor[2] = {1 << 20, 1 << 20};  // one block: the tensor
  Fp8Tensors(per_tensor).Write(dir_ + "/model.safetensors");
  WriteConfig(R"({"quant_method":"fp8"})");
  auto kept = LoadModel(dir_, true);
  ASSERT_TRUE(kept.ok()) << kept.status();
  const kernels::Matrix& down = (*kept)->layers[0].w_down;
  EXPECT_EQ(down.scale_block, 16);
  EXPECT_EQ(down.ScaleColumns(), 1);
  for (int64_t r = 0; r < down.rows; ++r) EXPECT_EQ(down.scales[r], down.scales[0]);
  const int odd[2] = {4, 3};
  Fp8Tensors(odd).Write(dir_ + "/model.safetensors");
  WriteConfig(R"({"quant_method":"fp8","weight_block_size":[4,3]})");
  auto refused = LoadModel(dir_, true);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("weight_dtype fp8 needs blocks of a multiple of 8 "
                                            "columns (weight_block_size gives 3)"),
            std::string::npos)
      << refused.status();
  EXPECT_TRUE(LoadModel(dir_).ok());
}

// The repository's tool writes stories260K as an FP8 checkpoint; loaded, every linear weight
// is within E4M3's rounding (half a step: 1/16 of the value for normals, 2^-10 of the block's
// scale for subnormals, plus bf16's) of the f32 conversion of the same checkpoint.
TEST_F(Fp8LoaderTest, TheToolsStories260KCheckpointLoadsWithinFp8Rounding) {
  RECALL_REQUIRE_SHARED_FILE("models/stories260K/stories260K.bin");
  const std::string tool = testing::SourcePath("tools/convert_llama2c_to_hf.py");
  const std::string model = testing::SharedPath("models/stories260K/stories260K.bin");
  const std::string f32_dir = dir_ + "/f32", fp8_dir = dir_ + "/fp8";
  for (const std::string& cmd :
       {absl::StrCat("python3 ", tool, " ", model, " ", f32_dir, " > /dev/null"),
        absl::StrCat("python3 ", tool, " ", model, " ", fp8_dir,
                     " --dtype fp8 --fp8-block 32 > /dev/null")}) {
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
  auto f32 = LoadModel(f32_dir);
  auto fp8 = LoadModel(fp8_dir);
  ASSERT_TRUE(f32.ok()) << f32.status();
  ASSERT_TRUE(fp8.ok()) << fp8.status();
  EXPECT_TRUE((*fp8)->config.fp8);
  EXPECT_EQ((*fp8)->config.fp8_block[0], 32);
  for (size_t layer = 0; layer < (*f32)->layers.size(); ++layer) {
    const LayerWeights& a = (*f32)->layers[layer];
    const LayerWeights& b = (*fp8)->layers[layer];
    for (const auto& [x, y] : {std::pair{&a.wq, &b.wq},
                               {&a.wk, &b.wk},
                               {&a.wv, &b.wv},
                               {&a.wo, &b.wo},
                               {&a.w_gate, &b.w_gate},
                               {&a.w_up, &b.w_up},
                               {&a.w_down, &b.w_down}}) {
      ASSERT_EQ(y->dtype, kernels::DType::kBF16);
      for (int64_t br = 0; br < x->rows; br += 32) {
        for (int64_t bc = 0; bc < x->cols; bc += 32) {
          float most = 0.0f;  // the block's scale, as the tool computes it
          for (int64_t r = br; r < std::min(x->rows, br + 32); ++r) {
            for (int64_t c = bc; c < std::min(x->cols, bc + 32); ++c) {
              most = std::max(most, std::fabs(LoadAsF32(x->data, x->dtype, r * x->cols + c)));
            }
          }
          const float scale = most / 448.0f;
          for (int64_t r = br; r < std::min(x->rows, br + 32); ++r) {
            for (int64_t c = bc; c < std::min(x->cols, bc + 32); ++c) {
              const float want = LoadAsF32(x->data, x->dtype, r * x->cols + c);
              const float got = LoadAsF32(y->data, y->dtype, r * y->cols + c);
              const float bound = std::max(std::fabs(want) / 16.0f, scale * std::ldexp(1.0f, -10)) +
                                  std::fabs(want) / 128.0f + 1e-12f;
              ASSERT_LE(std::fabs(got - want), bound)
                  << "layer " << layer << " [" << r << ", " << c << "]";
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace recall::model
