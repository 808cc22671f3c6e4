// ModelConfig::Validate and ArchName.
#include "worker/model/model_config.h"

#include <string>

#include "gtest/gtest.h"

namespace recall::model {
namespace {

ModelConfig Good() {
  ModelConfig c;
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

void ExpectInvalid(const ModelConfig& c, const std::string& needle) {
  const absl::Status s = c.Validate();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find(needle), std::string::npos) << s;
}

TEST(ModelConfigTest, AcceptsAConsistentConfig) { EXPECT_TRUE(Good().Validate().ok()); }

TEST(ModelConfigTest, AcceptsHeadDimThatDiffersFromDimOverHeads) {
  ModelConfig c = Good();  // Qwen3-style: n_heads * head_dim != dim
  c.head_dim = 16;
  EXPECT_TRUE(c.Validate().ok()) << c.Validate();
}

TEST(ModelConfigTest, RejectsNonPositiveFieldsByName) {
  struct Case {
    int ModelConfig::*field;
    const char* name;
  };
  const Case cases[] = {{&ModelConfig::dim, "dim"},
                        {&ModelConfig::hidden_dim, "hidden_dim"},
                        {&ModelConfig::n_layers, "n_layers"},
                        {&ModelConfig::n_heads, "n_heads"},
                        {&ModelConfig::n_kv_heads, "n_kv_heads"},
                        {&ModelConfig::head_dim, "head_dim"},
                        {&ModelConfig::vocab_size, "vocab_size"},
                        {&ModelConfig::max_seq_len, "max_seq_len"}};
  for (const Case& k : cases) {
    for (int bad : {0, -1}) {
      ModelConfig c = Good();
      c.*k.field = bad;
      ExpectInvalid(c, std::string(k.name) + " = " + std::to_string(bad));
    }
  }
}

TEST(ModelConfigTest, RejectsHugeValuesWithTheLimit) {
  ModelConfig c = Good();
  c.dim = 1 << 20;
  ExpectInvalid(c, "dim = 1048576 is out of range [1, 65536]");
}

TEST(ModelConfigTest, RejectsKvHeadsThatDoNotDivideHeads) {
  ModelConfig c = Good();
  c.n_kv_heads = 3;
  ExpectInvalid(c, "n_heads = 8 is not a multiple of n_kv_heads = 3");
}

TEST(ModelConfigTest, RejectsOddHeadDim) {
  ModelConfig c = Good();
  c.head_dim = 7;
  ExpectInvalid(c, "head_dim = 7 must be even");
}

TEST(ModelConfigTest, RejectsBadRopeThetaAndEps) {
  ModelConfig c = Good();
  c.rope_theta = 0.0f;
  ExpectInvalid(c, "rope_theta");
  c = Good();
  c.norm_eps = -1.0f;
  ExpectInvalid(c, "norm_eps");
}

TEST(ModelConfigTest, RejectsBosAndEosOutsideTheVocabulary) {
  ModelConfig c = Good();
  c.bos_token_id = 512;
  ExpectInvalid(c, "bos_token_id = 512 is outside [0, vocab_size = 512)");
  c = Good();
  c.eos_token_id = -2;
  ExpectInvalid(c, "eos_token_id = -2");
  c = Good();
  c.bos_token_id = -1;  // none
  c.eos_token_id = 511;
  EXPECT_TRUE(c.Validate().ok()) << c.Validate();
}

TEST(ModelConfigTest, ArchNames) {
  EXPECT_STREQ(ArchName(Arch::kLlama), "llama");
  EXPECT_STREQ(ArchName(Arch::kMistral), "mistral");
  EXPECT_STREQ(ArchName(Arch::kQwen2), "qwen2");
  EXPECT_STREQ(ArchName(Arch::kQwen3), "qwen3");
}

}  // namespace
}  // namespace recall::model
