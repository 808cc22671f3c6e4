// Small valid files for every loader, written from code (no shared/ needed).
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "fuzz/hf_fixture.h"
#include "fuzz/seeds/seeds.h"
#include "fuzz/seeds/sentencepiece_proto.h"
#include "tests/worker/model/test_files.h"

namespace recall::fuzz {
namespace {

namespace test = model::test;

std::string SafetensorsOf(const test::SafetensorsWriter& w, bool pad) {
  std::string header, data;
  w.Build(&header, &data, pad);
  return test::SafetensorsBytes(header, data, header.size());
}

void LlamaCheckpoints(const std::string& out) {
  const std::vector<std::vector<int32_t>> headers = {{8, 12, 2, 2, 1, 16, 4},
                                                     {8, 12, 2, 2, 1, -16, 4},
                                                     {8, 12, 1, 2, 2, 1, 2},
                                                     {16, 24, 1, 4, 2, 312, 8},
                                                     {4, 4, 1, 1, 1, 3, 1}};
  for (size_t i = 0; i < headers.size(); ++i) {
    WriteSeed(out, "llama2c_model", absl::StrCat("synthetic", i, ".bin"),
              test::Llama2cCheckpoint(headers[i]));
  }
}

void Safetensors(const std::string& out) {
  for (kernels::DType dtype : {kernels::DType::kF32, kernels::DType::kBF16, kernels::DType::kF16}) {
    test::TinyHf spec;
    spec.dtype = dtype;
    spec.layers = 1;
    for (bool pad : {true, false}) {
      WriteSeed(out, "safetensors",
                absl::StrCat("tiny_", kernels::DTypeName(dtype), pad ? "_padded" : "", ".st"),
                SafetensorsOf(spec.Tensors(), pad));
    }
  }
  test::SafetensorsWriter mixed;
  mixed.Add("a", test::TestTensor{{2, 2}, {1, 2, 3, 4}, kernels::DType::kF32, {}, {}});
  mixed.Add("b", test::TestTensor{{3}, {5, 6, 7}, kernels::DType::kBF16, {}, {}});
  mixed.Add("empty", test::TestTensor{{0, 4}, {}, kernels::DType::kF16, {}, {}});
  WriteSeed(out, "safetensors", "mixed.st", SafetensorsOf(mixed, true));
  WriteSeed(out, "safetensors", "no_tensors.st", test::SafetensorsBytes("{}", "", 2));
}

void HfConfigs(const std::string& out) {
  test::TinyHf spec;
  WriteSeed(out, "hf_config", "tiny_llama.json", spec.ConfigJson());  // fits the fixture
  spec.lm_head = false;
  WriteSeed(out, "hf_config", "tiny_tied.json", spec.ConfigJson());
  spec = test::TinyHf();
  spec.architecture = "Qwen3ForCausalLM";
  spec.explicit_head_dim = true;
  spec.head_dim = 8;
  WriteSeed(out, "hf_config", "tiny_qwen3.json", spec.ConfigJson());
  spec.architecture = "Qwen2ForCausalLM";
  WriteSeed(out, "hf_config", "tiny_qwen2.json", spec.ConfigJson());
  WriteSeed(out, "hf_config", "model_type.json",
            "{\"model_type\":\"mistral\",\"hidden_size\":8,\"intermediate_size\":12,"
            "\"num_hidden_layers\":2,\"num_attention_heads\":2,\"num_key_value_heads\":1,"
            "\"vocab_size\":16,\"rope_scaling\":{\"rope_type\":\"default\"},"
            "\"hidden_act\":\"silu\",\"bos_token_id\":null,\"eos_token_id\":[4,5]}");
}

void HfIndex(const std::string& out) {
  const std::string dir = out + "/.hf_index_fixture";
  std::filesystem::create_directories(dir);
  WriteSeed(out, "hf_index", "index.json", WriteHfFixture(dir, /*sharded=*/true));
  std::filesystem::remove_all(dir);
}

void Llama2cTokenizers(const std::string& out) {
  for (int vocab : {8, 259, test::kLlama2cTokenizerMaxVocab}) {
    WriteSeed(out, "llama2c_tokenizer", absl::StrCat("synthetic", vocab, ".bin"),
              test::Llama2cTokenizerBytes(vocab));
  }
}

void SentencePieceModels(const std::string& out) {
  std::vector<sp::Piece> pieces = {
      {"<unk>", 0, sp::kUnknown}, {"<s>", 0, sp::kControl}, {"</s>", 0, sp::kControl}};
  for (int b = 0; b < 256; ++b) {
    char hex[8];
    std::snprintf(hex, sizeof(hex), "<0x%02X>", b);
    pieces.push_back({hex, 0, sp::kByte});
  }
  const char* words[] = {"\xE2\x96\x81",
                         "a",
                         "b",
                         "c",
                         "\xE2\x96\x81"
                         "a",
                         "ab",
                         "abc",
                         "\xE2\x96\x81"
                         "ab"};
  float score = -1;
  for (const char* w : words) pieces.push_back({w, score--, sp::kNormal});
  pieces.push_back({"<|im_end|>", 0, sp::kUserDefined});
  WriteSeed(out, "sentencepiece", "bpe_byte_fallback.model",
            sp::ModelProto(sp::kBpe, pieces, /*byte_fallback=*/true));
  WriteSeed(out, "sentencepiece", "unigram_byte_fallback.model",
            sp::ModelProto(sp::kUnigram, pieces, /*byte_fallback=*/true));
  std::vector<sp::Piece> small = {
      {"<unk>", 0, sp::kUnknown}, {"<s>", 0, sp::kControl}, {"</s>", 0, sp::kControl}};
  score = -1;
  for (const char* w : words) small.push_back({w, score--, sp::kNormal});
  WriteSeed(out, "sentencepiece", "unigram.model",
            sp::ModelProto(sp::kUnigram, small, /*byte_fallback=*/false));
}

void HfTokenizers(const std::string& out) {
  const std::string byte_level = test::ByteLevelTokenizerJson();
  WriteSeed(out, "hf_tokenizer", "byte_level.json", byte_level);
  const std::string minimal_model =
      "\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1,\"ab\":2,\"\xC4\xA0\":3,"
      "\"\xC4\xA0"
      "a\":4,\"1\":5,\"<s>\":6,\"<|im_end|>\":7},\"merges\":[\"a b\",\"\xC4\xA0 a\"],"
      "\"unk_token\":\"<s>\",\"ignore_merges\":false}";
  WriteSeed(out, "hf_tokenizer", "minimal.json",
            absl::StrCat("{", minimal_model,
                         ",\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":true},"
                         "\"decoder\":{\"type\":\"ByteLevel\"}}"));
  WriteSeed(
      out, "hf_tokenizer", "full_featured.json",
      absl::StrCat(
          "{", minimal_model,
          ",\"normalizer\":{\"type\":\"Sequence\",\"normalizers\":[{\"type\":\"NFC\"}]},"
          "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":["
          "{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\s+|[a-z]+\"},\"behavior\":"
          "\"MergedWithNext\",\"invert\":false},{\"type\":\"Digits\",\"individual_digits\":true},"
          "{\"type\":\"Split\",\"pattern\":{\"String\":\"b\"},\"behavior\":\"Contiguous\"},"
          "{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":true}]},"
          "\"post_processor\":{\"type\":\"TemplateProcessing\",\"single\":[{\"SpecialToken\":"
          "{\"id\":\"<s>\",\"type_id\":0}},{\"Sequence\":{\"id\":\"A\",\"type_id\":0}}],"
          "\"special_tokens\":{\"<s>\":{\"id\":\"<s>\",\"ids\":[6],\"tokens\":[\"<s>\"]}}},"
          "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"ByteLevel\"}]},"
          "\"added_tokens\":[{\"id\":6,\"content\":\"<s>\",\"special\":true},{\"id\":7,"
          "\"content\":\"<|im_end|>\",\"special\":true,\"lstrip\":true,\"rstrip\":true},"
          "{\"id\":8,\"content\":\"ab\",\"single_word\":true,\"normalized\":true}]}"));
}

}  // namespace

void WriteSyntheticSeeds(const std::string& out) {
  LlamaCheckpoints(out);
  Safetensors(out);
  HfConfigs(out);
  HfIndex(out);
  Llama2cTokenizers(out);
  SentencePieceModels(out);
  HfTokenizers(out);
}

}  // namespace recall::fuzz
