// LoadHuggingFace / LoadModel: a checkpoint that config.json does not describe exactly is
// refused by name (tensors the model would not read, an untied model without its head, a
// file of the directory given for the directory), while what real checkpoints hold and
// Recall rightly leaves unread (a tied model's stored lm_head.weight, rotary inv_freq
// buffers) still loads.
#include <filesystem>
#include <string>

#include "gtest/gtest.h"
#include "tests/common/test_util.h"
#include "tests/worker/model/test_files.h"
#include "worker/model/loader.h"

namespace recall::model {
namespace {

using test::TinyHf;

class HfCheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::MakeTempDir("hf_checkpoint"); }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // The config of `spec` with its "tie_word_embeddings" entry replaced by `with` ("" drops it).
  static std::string ConfigWithTie(const TinyHf& spec, const std::string& with) {
    std::string json = spec.ConfigJson();
    const std::string tie =
        absl::StrCat("\"tie_word_embeddings\":", spec.lm_head ? "false" : "true", ",");
    json.replace(json.find(tie), tie.size(), with);
    return json;
  }

  std::string dir_;
};

// num_hidden_layers 7 on an 8-layer file loaded the first 7 layers and printed garbage.
TEST_F(HfCheckpointTest, LayersPastNumHiddenLayersAreRefused) {
  TinyHf file;
  file.layers = 8;
  file.Tensors().Write(dir_ + "/model.safetensors");
  TinyHf config = file;
  config.layers = 7;
  config.WriteConfig(dir_);
  auto m = LoadHuggingFace(dir_);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << m.status();
  EXPECT_EQ(m.status().message(),
            dir_ +
                "/model.safetensors: tensor \"model.layers.7.input_layernorm.weight\" is not "
                "used by config.json (num_hidden_layers 7)");
}

// A q/k/v bias in a Llama checkpoint (no attention_bias) was dropped without a word.
TEST_F(HfCheckpointTest, ABiasTheArchitectureTakesNoneOfIsRefused) {
  TinyHf spec;
  spec.qkv_bias = true;  // written, but LlamaForCausalLM reads no bias
  spec.Write(dir_);
  auto m = LoadHuggingFace(dir_);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << m.status();
  EXPECT_EQ(m.status().message(),
            dir_ +
                "/model.safetensors: tensor \"model.layers.0.self_attn.k_proj.bias\" is not "
                "used by config.json (architecture llama without attention_bias takes no "
                "q/k/v bias)");
}

// Any other stray tensor, in a single file or in a shard, names the file holding it.
TEST_F(HfCheckpointTest, AnyOtherUnreadTensorIsRefusedNamingItsFile) {
  TinyHf spec;
  spec.WriteConfig(dir_);
  test::SafetensorsWriter w = spec.Tensors();
  w.Add("model.layers.0.mlp.gate_proj.weight_scale_inv", {{1}, {1.0f}});
  w.Write(dir_ + "/model.safetensors");
  auto m = LoadHuggingFace(dir_);
  EXPECT_EQ(m.status().message(),
            dir_ +
                "/model.safetensors: tensor \"model.layers.0.mlp.gate_proj.weight_scale_inv\" "
                "is not used by config.json (no quantization_config with quant_method "
                "\"fp8\")");

  std::filesystem::remove(dir_ + "/model.safetensors");
  test::SafetensorsWriter all = spec.Tensors(), extra;
  extra.Add("vision_tower.proj.weight", {{2}, {1.0f, 2.0f}});
  all.Write(dir_ + "/model-00001-of-00002.safetensors");
  extra.Write(dir_ + "/model-00002-of-00002.safetensors");
  std::string index =
      "{\"weight_map\":{\"vision_tower.proj.weight\":"
      "\"model-00002-of-00002.safetensors\"";
  for (const auto& [name, t] : all.tensors()) {
    absl::StrAppend(&index, ",\"", name, "\":\"model-00001-of-00002.safetensors\"");
  }
  test::WriteFile(dir_ + "/model.safetensors.index.json", index + "}}");
  m = LoadHuggingFace(dir_);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << m.status();
  EXPECT_EQ(m.status().message(),
            dir_ +
                "/model-00002-of-00002.safetensors: tensor \"vision_tower.proj.weight\" is "
                "not used by config.json (architecture llama has no such tensor)");
}

// Unread but legitimate: a tied model's stored lm_head.weight (Hugging Face ties over it) and
// the rotary inv_freq buffers older checkpoints hold.
TEST_F(HfCheckpointTest, ATiedModelsLmHeadAndInvFreqBuffersAreAccepted) {
  TinyHf spec;  // lm_head.weight written
  test::WriteFile(dir_ + "/config.json", ConfigWithTie(spec, "\"tie_word_embeddings\":true,"));
  test::SafetensorsWriter w = spec.Tensors();
  w.Add("model.layers.0.self_attn.rotary_emb.inv_freq", {{2}, {1.0f, 0.5f}});
  w.Add("model.layers.1.self_attn.rotary_emb.inv_freq", {{2}, {1.0f, 0.5f}});
  w.Write(dir_ + "/model.safetensors");
  auto m = LoadHuggingFace(dir_);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE((*m)->config.tied_embeddings);
  EXPECT_EQ((*m)->lm_head.data, (*m)->tok_embeddings.data);
}

// tie_word_embeddings false given with no lm_head.weight used the embeddings as the head.
TEST_F(HfCheckpointTest, ExplicitlyUntiedWithoutLmHeadIsRefused) {
  TinyHf spec;
  spec.lm_head = false;
  spec.Tensors().Write(dir_ + "/model.safetensors");
  test::WriteFile(dir_ + "/config.json", ConfigWithTie(spec, "\"tie_word_embeddings\":false,"));
  auto m = LoadHuggingFace(dir_);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << m.status();
  EXPECT_EQ(m.status().message(),
            dir_ + "/config.json: field \"tie_word_embeddings\" is false, but " + dir_ +
                "/model.safetensors has no tensor \"lm_head.weight\" (set it true to use the "
                "embeddings as the head)");

  // Without the key, a checkpoint lacking the head is tied, as before.
  test::WriteFile(dir_ + "/config.json", ConfigWithTie(spec, ""));
  m = LoadHuggingFace(dir_);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_TRUE((*m)->config.tied_embeddings);
}

// weight_map: 3 was called a missing object.
TEST_F(HfCheckpointTest, AWeightMapThatIsNoObjectIsSaidSo) {
  TinyHf spec;
  spec.WriteConfig(dir_);
  test::WriteFile(dir_ + "/model.safetensors.index.json", "{\"weight_map\": 3}");
  auto m = LoadHuggingFace(dir_);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << m.status();
  EXPECT_EQ(m.status().message(), dir_ +
                                      "/model.safetensors.index.json: field \"weight_map\" "
                                      "is not an object (got 3)");
}

// -m DIR/config.json was read as a llama2.c checkpoint ("header field dim = 538970747").
TEST_F(HfCheckpointTest, AFileOfTheDirectoryGivenAsTheModelSaysToGiveTheDirectory) {
  TinyHf spec;
  spec.Write(dir_);
  test::WriteFile(dir_ + "/model-00001-of-00002.safetensors", "x");
  for (const char* name :
       {"config.json", "model.safetensors", "model-00001-of-00002.safetensors"}) {
    const std::string path = dir_ + "/" + name;
    auto m = LoadModel(path);
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << m.status();
    EXPECT_EQ(m.status().message(),
              path +
                  " is a file of a Hugging Face model directory, not a llama2.c checkpoint: "
                  "give the directory (" +
                  dir_ + ") as the model");
  }
}

// Another format's file said "header field dim = 1179993927 is invalid" (GGUF's magic read as
// a dimension): named for what it is, or asked whether it is a llama2.c checkpoint.
TEST_F(HfCheckpointTest, AnotherFormatsFileIsSaidToBeOne) {
  const std::string gguf = dir_ + "/model.gguf", noise = dir_ + "/noise.bin";
  test::WriteFile(gguf, std::string("GGUF\x03\0\0\0", 8) + std::string(200, '\x07'));
  auto m = LoadModel(gguf);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << m.status();
  EXPECT_EQ(m.status().message(),
            gguf +
                " is a GGUF file: Recall reads llama2.c checkpoints and Hugging Face model "
                "directories (config.json and safetensors)");
  test::WriteFile(noise, std::string(4096, '\x7f'));
  m = LoadModel(noise);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << m.status();
  EXPECT_NE(m.status().message().find(": header field dim = "), std::string::npos) << m.status();
  EXPECT_NE(m.status().message().find("(is it a llama2.c checkpoint? Recall reads"),
            std::string::npos)
      << m.status();
}

}  // namespace
}  // namespace recall::model
