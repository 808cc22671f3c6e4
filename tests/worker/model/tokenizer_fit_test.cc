// CheckTokenizerFitsModel, and LoadAll refusing a model/tokenizer pair a turn could not run
// on (issue 27: a llama2.c header with vocab_size 8 loaded 8 tokens of a 512-token
// tokenizer.bin, and the first turn's encode indexed past them).
#include "worker/model/tokenizer_fit.h"

#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/common/test_util.h"
#include "tests/worker/model/test_files.h"
#include "worker/model/load.h"

namespace recall::model {
namespace {

bool Contains(const absl::Status& s, const std::string& needle) {
  return s.message().find(needle) != absl::string_view::npos;
}

// A tokenizer whose ids and special tokens a test sets.
class FakeTokenizer final : public Tokenizer {
 public:
  int vocab = 10;
  int32_t bos = 1, eos = 2;
  std::vector<int32_t> encoded = {3, 4};
  std::optional<int32_t> im_end;

  std::vector<int32_t> Encode(std::string_view, bool add_bos, bool) const override {
    std::vector<int32_t> ids = encoded;
    if (add_bos) ids.insert(ids.begin(), bos);
    return ids;
  }
  std::string Decode(const std::vector<int32_t>&, bool) const override { return ""; }
  std::string TokenBytes(int32_t, int32_t) const override { return ""; }
  int vocab_size() const override { return vocab; }
  int32_t bos_id() const override { return bos; }
  int32_t eos_id() const override { return eos; }
  std::optional<int32_t> PieceToId(std::string_view piece) const override {
    return piece == "<|im_end|>" ? im_end : std::nullopt;
  }
};

ModelConfig ConfigWithVocab(int vocab) {
  ModelConfig c;
  c.vocab_size = vocab;
  return c;
}

TEST(CheckTokenizerFitsModelTest, AcceptsATokenizerInsideTheModelsVocabulary) {
  FakeTokenizer tok;
  EXPECT_TRUE(CheckTokenizerFitsModel(ConfigWithVocab(10), tok, "tok.bin").ok());
  EXPECT_TRUE(CheckTokenizerFitsModel(ConfigWithVocab(32), tok, "tok.bin").ok());
}

TEST(CheckTokenizerFitsModelTest, RefusesAVocabularyLargerThanTheModelsOrEmpty) {
  FakeTokenizer tok;
  absl::Status s = CheckTokenizerFitsModel(ConfigWithVocab(8), tok, "tok.bin");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(Contains(s,
                       "tok.bin: its vocabulary (10 tokens) is larger than the model's "
                       "(vocab_size 8)"))
      << s;
  tok.vocab = 0;
  s = CheckTokenizerFitsModel(ConfigWithVocab(8), tok, "tok.bin");
  EXPECT_TRUE(Contains(s, "is empty")) << s;
}

TEST(CheckTokenizerFitsModelTest, RefusesSpecialIdsOutsideTheVocabulary) {
  FakeTokenizer tok;
  tok.eos = 10;
  absl::Status s = CheckTokenizerFitsModel(ConfigWithVocab(10), tok, "tok.bin");
  EXPECT_TRUE(Contains(s, "tok.bin: its EOS id 10 is outside its vocabulary [0, 10)")) << s;
  tok = FakeTokenizer();
  tok.im_end = 12;
  s = CheckTokenizerFitsModel(ConfigWithVocab(10), tok, "tok.bin");
  EXPECT_TRUE(Contains(s,
                       "tok.bin: the chatml stop token id 12 is outside the model's "
                       "vocabulary [0, 10)"))
      << s;
}

TEST(CheckTokenizerFitsModelTest, RefusesAnEncodeThatGivesAnIdOutsideTheVocabulary) {
  FakeTokenizer tok;
  tok.encoded = {3, 258};
  const absl::Status s = CheckTokenizerFitsModel(ConfigWithVocab(10), tok, "tok.bin");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_TRUE(Contains(s,
                       "tok.bin: encoding a probe text gives token id 258, outside its "
                       "vocabulary [0, 10)"))
      << s;
}

class LoadPairTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::MakeTempDir("load_pair"); }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // A tiny llama2.c checkpoint of `model_vocab` tokens and a tokenizer.bin of `tok_vocab`.
  absl::StatusOr<Loaded> Load(int model_vocab, int tok_vocab) {
    LoadOptions o;
    o.model = dir_ + "/model.bin";
    o.tokenizer = dir_ + "/tok.bin";
    test::WriteFile(o.model, test::Llama2cCheckpoint({8, 12, 2, 2, 1, model_vocab, 16}));
    test::WriteFile(o.tokenizer, test::Llama2cTokenizerBytes(tok_vocab));
    return LoadAll(o);
  }
  std::string dir_;
};

TEST_F(LoadPairTest, AMatchingPairLoads) {
  auto loaded = Load(300, 300);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ(loaded->tokenizer->vocab_size(), 300);
  EXPECT_EQ(loaded->tokenizer->Encode("a b", true), (std::vector<int32_t>{1, 286, 287}));
}

TEST_F(LoadPairTest, ATokenizerWithMoreTokensThanTheModelIsRefusedNamingBoth) {
  for (int model_vocab : {1, 8, 258}) {
    auto loaded = Load(model_vocab, 300);
    ASSERT_FALSE(loaded.ok()) << model_vocab;
    EXPECT_EQ(loaded.status().code(), absl::StatusCode::kInvalidArgument) << loaded.status();
    EXPECT_TRUE(Contains(loaded.status(), dir_ + "/tok.bin: holds more than vocab_size = " +
                                              std::to_string(model_vocab) + " tokens"))
        << loaded.status();
  }
}

TEST_F(LoadPairTest, ATinyConsistentVocabularyLoadsAndEncodesInsideIt) {
  // vocab 8 in both files: no room for byte fallback, so unknown bytes encode as <unk>.
  for (int vocab : {1, 3, 8}) {
    auto loaded = Load(vocab, vocab);
    ASSERT_TRUE(loaded.ok()) << vocab << ": " << loaded.status();
    for (int32_t id : loaded->tokenizer->Encode("Once upon a time \xff", true)) {
      EXPECT_TRUE(id >= 0 && id < vocab) << id;
    }
  }
}

}  // namespace
}  // namespace recall::model
