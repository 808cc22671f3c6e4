// The eos_token_id of a Hugging Face model directory (tokenizer_eos_ids.h): read the same way
// beside tokenizer.json and tokenizer.model, and generation_config.json held to config.json's
// rule (a value that is not a token id is refused naming the file and the field).
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/test_util.h"
#include "tests/worker/tokenizer/tokenizer_test_util.h"
#include "worker/tokenizer/tokenizer.h"

namespace recall::model {
namespace {

using ::recall::testing::SharedPath;

constexpr char kSpModel[] = "tokenizers/llama2-32k/tokenizer.model";

class EosIdsTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = ::recall::testing::MakeTempDir("eos_ids"); }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // A byte-level BPE tokenizer.json of 3 tokens (ids 0..2) in dir_.
  void WriteTinyTokenizerJson() {
    const nlohmann::json minimal = {
        {"model",
         {{"type", "BPE"}, {"vocab", {{"a", 0}, {"b", 1}, {"ab", 2}}}, {"merges", {"a b"}}}},
        {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
        {"decoder", {{"type", "ByteLevel"}}}};
    testing::WriteFile(dir_ + "/tokenizer.json", minimal.dump());
  }

  std::string dir_;
};

// A Hugging Face directory whose tokenizer is tokenizer.model ended a reply only at the
// SentencePiece </s>: generation_config.json's (else config.json's) eos_token_id list was
// ignored. Now every id of it ends one, as beside tokenizer.json, and </s> still does.
TEST_F(EosIdsTest, ASentencePieceTokenizerTakesTheModelsEosList) {
  RECALL_REQUIRE_SHARED_FILE(kSpModel);
  std::filesystem::copy_file(SharedPath(kSpModel), dir_ + "/tokenizer.model");
  testing::WriteFile(dir_ + "/config.json", R"({"eos_token_id": [2, 32000]})");
  testing::WriteFile(dir_ + "/generation_config.json", R"({"eos_token_id": [13, 2, 29889]})");
  auto tok = LoadTokenizer(dir_);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->eos_id(), 2);
  EXPECT_EQ((*tok)->end_ids(), (std::vector<int32_t>{2, 13, 29889}));

  std::filesystem::remove(dir_ + "/generation_config.json");  // then config.json's
  tok = LoadTokenizer(dir_);
  ASSERT_FALSE(tok.ok());  // 32000 is past the 32000 pieces
  EXPECT_EQ(tok.status().message(), dir_ +
                                        "/config.json: field \"eos_token_id[1]\" = 32000 is "
                                        "not a token id (vocab_size 32000)");
  testing::WriteFile(dir_ + "/config.json", R"({"eos_token_id": 13})");
  tok = LoadSentencePieceTokenizer(dir_ + "/tokenizer.model");
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->end_ids(), (std::vector<int32_t>{2, 13}));

  testing::WriteFile(dir_ + "/config.json", R"({"eos_token_id": -1})");  // none, as for models
  tok = LoadTokenizer(dir_);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->end_ids(), (std::vector<int32_t>{2}));

  std::filesystem::remove(dir_ + "/config.json");  // a bare tokenizer.model: its </s> alone
  tok = LoadTokenizer(dir_);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->end_ids(), (std::vector<int32_t>{2}));
}

// generation_config.json was never checked: a broken one, or an eos_token_id that names no
// token, was passed over for config.json's without a word.
TEST_F(EosIdsTest, AnInvalidGenerationConfigIsRefusedNamingItAndTheField) {
  WriteTinyTokenizerJson();
  testing::WriteFile(dir_ + "/config.json", R"({"eos_token_id": 1})");
  const std::string gen = dir_ + "/generation_config.json";
  const std::string field = gen + ": field \"eos_token_id";
  const struct {
    const char* text;
    std::string message;
  } cases[] = {
      {R"({"eos_token_id": "</s>"})", field + "\" = \"</s>\" is not a token id (vocab_size 3)"},
      {R"({"eos_token_id": -1})", field + "\" = -1 is not a token id (vocab_size 3)"},
      {R"({"eos_token_id": 1.0})", field + "\" = 1.0 is not a token id (vocab_size 3)"},
      {R"({"eos_token_id": [2, 0, 9]})", field + "[2]\" = 9 is not a token id (vocab_size 3)"},
      {R"({"eos_token_id": [2, -4]})", field + "[1]\" = -4 is not a token id (vocab_size 3)"},
      {R"({"eos_token_id": null})",
       field + "\" = null names no token (leave the field out to use config.json's)"},
      {R"({"eos_token_id": []})",
       field + "\" = [] names no token (leave the field out to use config.json's)"},
      {R"([{"eos_token_id": 2}])", gen + ": not a JSON object"},
  };
  for (const auto& c : cases) {
    testing::WriteFile(gen, c.text);
    auto tok = LoadTokenizer(dir_);
    ASSERT_FALSE(tok.ok()) << c.text;
    EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument) << tok.status();
    EXPECT_EQ(tok.status().message(), c.message) << c.text;
  }
  testing::WriteFile(gen, R"({"eos_token_id": [2,)");
  auto tok = LoadTokenizer(dir_);
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument) << tok.status();
  EXPECT_EQ(tok.status().message().rfind(gen + ": invalid JSON: ", 0), 0u) << tok.status();

  // Without eos_token_id, or with fields Recall does not use, it stays accepted.
  for (const char* text : {"{}", R"({"do_sample": true, "temperature": 0.6, "top_p": 0.9})"}) {
    testing::WriteFile(gen, text);
    tok = LoadTokenizer(dir_);
    ASSERT_TRUE(tok.ok()) << text << ": " << tok.status();
    EXPECT_EQ((*tok)->end_ids(), (std::vector<int32_t>{1})) << text;  // config.json's
  }
  testing::WriteFile(gen, R"({"eos_token_id": 2, "pad_token_id": 0})");
  tok = LoadTokenizer(dir_);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->end_ids(), (std::vector<int32_t>{2}));
}

}  // namespace
}  // namespace recall::model
