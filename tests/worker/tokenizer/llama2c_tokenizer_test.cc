// llama2.c tokenizer.bin: encode/decode against a literal port of run.c, truncated and
// corrupt files.
#include <cstring>
#include <map>
#include <random>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"
#include "tests/worker/tokenizer/tokenizer_test_util.h"
#include "worker/tokenizer/tokenizer.h"

namespace recall::model {
namespace {

using ::recall::testing::ReadFileOrEmpty;
using ::recall::testing::SharedPath;

constexpr char kTok512[] = "models/stories260K/tok512.bin";
constexpr char kTok32k[] = "tokenizers/llama2-32k/tokenizer.bin";

// run.c's encode(), line for line (O(n^2) merge loop), over a parsed tokenizer.bin.
class RunCReference {
 public:
  RunCReference(const std::string& path, int vocab_size) {
    const std::string data = ReadFileOrEmpty(path);
    size_t pos = 4;
    for (int i = 0; i < vocab_size; ++i) {
      float score;
      int32_t len;
      std::memcpy(&score, data.data() + pos, 4);
      std::memcpy(&len, data.data() + pos + 4, 4);
      pos += 8;
      vocab_.push_back(data.substr(pos, len));
      scores_.push_back(score);
      pos += len;
      sorted_.emplace(vocab_.back(), i);
    }
  }

  std::vector<int32_t> Encode(const std::string& text, bool bos) const {
    std::vector<int32_t> tokens;
    if (bos) tokens.push_back(1);
    if (!text.empty()) tokens.push_back(Lookup(" "));
    std::string buf;
    for (size_t c = 0; c < text.size(); ++c) {
      if ((text[c] & 0xC0) != 0x80) buf.clear();
      buf += text[c];
      const char next = c + 1 < text.size() ? text[c + 1] : '\0';
      if ((next & 0xC0) == 0x80 && buf.size() < 4) continue;
      const int id = Lookup(buf);
      if (id != -1) {
        tokens.push_back(id);
      } else {
        for (unsigned char b : buf) tokens.push_back(b + 3);
      }
      buf.clear();
    }
    while (true) {
      float best_score = -1e10;
      int best_id = -1, best_idx = -1;
      for (int i = 0; i + 1 < static_cast<int>(tokens.size()); ++i) {
        const int id = Lookup(vocab_[tokens[i]] + vocab_[tokens[i + 1]]);
        if (id != -1 && scores_[id] > best_score) {
          best_score = scores_[id];
          best_id = id;
          best_idx = i;
        }
      }
      if (best_idx == -1) break;
      tokens[best_idx] = best_id;
      tokens.erase(tokens.begin() + best_idx + 1);
    }
    return tokens;
  }

 private:
  int Lookup(const std::string& s) const {
    auto it = sorted_.find(s);
    return it == sorted_.end() ? -1 : it->second;
  }
  std::vector<std::string> vocab_;
  std::vector<float> scores_;
  std::map<std::string, int> sorted_;
};

// Random text: ASCII words and punctuation, with some multi-byte characters mixed in.
std::string RandomText(std::mt19937* rng, size_t length) {
  static const std::vector<std::string> kAlphabet = {"a",
                                                     "e",
                                                     "t",
                                                     "o",
                                                     "n",
                                                     " ",
                                                     " ",
                                                     "s",
                                                     "h",
                                                     "r",
                                                     "d",
                                                     "l",
                                                     "T",
                                                     "O",
                                                     ".",
                                                     ",",
                                                     "!",
                                                     "\n",
                                                     "\t",
                                                     "1",
                                                     "7",
                                                     "'",
                                                     "\"",
                                                     "\xC3\xA9",
                                                     "\xE4\xB8\xAD",
                                                     "\xF0\x9F\x98\x80",
                                                     "~"};
  std::string out;
  while (out.size() < length) out += kAlphabet[(*rng)() % kAlphabet.size()];
  return out;
}

class Llama2cTokenizerTest : public ::testing::Test {
 protected:
  std::unique_ptr<Tokenizer> Load(const std::string& relative, int vocab_size) {
    auto tok = LoadLlama2cTokenizer(SharedPath(relative), vocab_size);
    EXPECT_TRUE(tok.ok()) << tok.status();
    return tok.ok() ? *std::move(tok) : nullptr;
  }
};

TEST_F(Llama2cTokenizerTest, Tok512LoadsWithItsSpecialIds) {
  RECALL_REQUIRE_SHARED_FILE(kTok512);
  auto tok = Load(kTok512, 512);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->vocab_size(), 512);
  EXPECT_EQ(tok->bos_id(), 1);
  EXPECT_EQ(tok->eos_id(), 2);
  EXPECT_EQ(tok->PieceToId("<0x0A>"), 13);
  EXPECT_EQ(tok->PieceToId("no such piece"), std::nullopt);
  // vocab_size 0: read every token up to the end of the file.
  auto all = LoadLlama2cTokenizer(SharedPath(kTok512), 0);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ((*all)->vocab_size(), 512);
}

// A NUL byte is a byte like any other (its byte fallback), not the end of the text (run.c's
// C string ended there, and a served prompt lost everything after it unseen).
TEST_F(Llama2cTokenizerTest, ANulByteIsEncodedNotAnEnd) {
  RECALL_REQUIRE_SHARED_FILE(kTok512);
  auto tok = Load(kTok512, 512);
  ASSERT_NE(tok, nullptr);
  const std::vector<int32_t> ids = tok->Encode(std::string("hi\0 there", 9), false);
  const std::vector<int32_t> before = tok->Encode("hi", false);
  ASSERT_GT(ids.size(), before.size() + 1);
  EXPECT_TRUE(std::equal(before.begin(), before.end(), ids.begin()));
  EXPECT_EQ(ids[before.size()], *tok->PieceToId("<0x00>"));
  // What follows the NUL is " there", encoded as it would be after any byte.
  EXPECT_EQ(tok->Decode(std::vector<int32_t>(ids.begin() + before.size() + 1, ids.end())),
            " there");
}

TEST_F(Llama2cTokenizerTest, Llama32kEncodesTheKnownPromptIds) {
  RECALL_REQUIRE_SHARED_FILE(kTok32k);
  auto tok = Load(kTok32k, 32000);
  ASSERT_NE(tok, nullptr);
  // The Llama 2 ids of "Once upon a time" (BOS, ▁Once, ▁upon, ▁a, ▁time).
  EXPECT_EQ(tok->Encode("Once upon a time", true), (std::vector<int32_t>{1, 9038, 2501, 263, 931}));
  EXPECT_EQ(tok->Encode("", true), (std::vector<int32_t>{1}));
  EXPECT_EQ(tok->Encode("", false), (std::vector<int32_t>{}));
}

TEST_F(Llama2cTokenizerTest, EncodeMatchesRunCOnCorpusAndRandomText) {
  RECALL_REQUIRE_SHARED_FILE(kTok512);  // the 32k vocabulary is checked too when present
  for (const auto& [file, vocab] : {std::pair{kTok512, 512}, std::pair{kTok32k, 32000}}) {
    if (!std::filesystem::exists(SharedPath(file))) continue;
    SCOPED_TRACE(file);
    auto tok = Load(file, vocab);
    ASSERT_NE(tok, nullptr);
    const RunCReference reference(SharedPath(file), vocab);
    for (const std::string& text : testing::LoadCorpus()) {
      // run.c stops at a NUL byte; the corpus has none.
      EXPECT_EQ(tok->Encode(text, true, false), reference.Encode(text, true)) << text;
      EXPECT_EQ(tok->Encode(text, false, false), reference.Encode(text, false)) << text;
    }
    std::mt19937 rng(1234);
    for (int i = 0; i < 60; ++i) {
      const std::string text = RandomText(&rng, 1 + rng() % 120);
      EXPECT_EQ(tok->Encode(text, true), reference.Encode(text, true)) << text;
    }
  }
}

TEST_F(Llama2cTokenizerTest, DecodeReproducesTheGoldenStoryText) {
  RECALL_REQUIRE_SHARED_FILE(kTok512);
  const std::string golden =
      ReadFileOrEmpty(SharedPath("models/stories260K/golden_greedy_once_upon_a_time_n256.txt"));
  ASSERT_FALSE(golden.empty());
  auto tok = Load(kTok512, 512);
  ASSERT_NE(tok, nullptr);
  const std::vector<int32_t> ids = tok->Encode(golden, true);
  EXPECT_EQ(ids.front(), 1);
  EXPECT_EQ(tok->Decode(ids), golden);  // the space of the dummy prefix is dropped after BOS
  // Streaming the same ids gives the same text.
  TokenStreamDecoder stream(*tok);
  std::string streamed;
  for (int32_t id : ids) streamed += stream.Next(id);
  streamed += stream.Flush();
  EXPECT_EQ(streamed, golden);
}

TEST_F(Llama2cTokenizerTest, DecodeFollowsRunCSafePrintf) {
  RECALL_REQUIRE_SHARED_FILE(kTok512);
  auto tok = Load(kTok512, 512);
  ASSERT_NE(tok, nullptr);
  const int32_t space_the = *tok->PieceToId(" the");
  // After BOS the leading space goes; elsewhere it stays.
  EXPECT_EQ(tok->TokenBytes(1, space_the), "the");
  EXPECT_EQ(tok->TokenBytes(space_the, space_the), " the");
  EXPECT_EQ(tok->Decode({1, space_the, space_the}), "the the");
  EXPECT_EQ(tok->Decode({space_the}), " the");
  // Byte pieces: printable and whitespace bytes print, others print nothing.
  EXPECT_EQ(tok->TokenBytes(space_the, 'A' + 3), "A");
  EXPECT_EQ(tok->TokenBytes(space_the, '\n' + 3), "\n");
  EXPECT_EQ(tok->TokenBytes(space_the, 0x01 + 3), "");
  EXPECT_EQ(tok->TokenBytes(space_the, 0xE2 + 3), "");
  EXPECT_EQ(tok->TokenBytes(space_the, 0x00 + 3), "");
  // BOS/EOS mid-stream print their pieces unless skipped.
  EXPECT_EQ(tok->Decode({space_the, 2}), " the\n</s>\n");
  EXPECT_EQ(tok->Decode({space_the, 2}, /*skip_special=*/true), " the");
  EXPECT_EQ(tok->Decode({-5, 100000}), "");
}

TEST_F(Llama2cTokenizerTest, ParseSpecialTurnsLiteralMarkersIntoBosAndEos) {
  RECALL_REQUIRE_SHARED_FILE(kTok32k);
  auto tok = Load(kTok32k, 32000);
  ASSERT_NE(tok, nullptr);
  std::vector<int32_t> expected = {1};
  // The text between the markers is one segment, encoded with its own dummy prefix.
  for (int32_t id : tok->Encode("[INST] hi [/INST] ok ", false)) expected.push_back(id);
  expected.push_back(2);
  EXPECT_EQ(tok->Encode("<s>[INST] hi [/INST] ok </s>", false, true), expected);
  // Without parse_special the markers are text.
  const RunCReference reference(SharedPath(kTok32k), 32000);
  EXPECT_EQ(tok->Encode("<s>x</s>", false, false), reference.Encode("<s>x</s>", false));
}

class Llama2cTokenizerFileErrorTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = ::recall::testing::MakeTempDir("llama2c_errors"); }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string dir_;
};

TEST_F(Llama2cTokenizerFileErrorTest, MissingFileIsNotFoundNamingThePath) {
  const std::string path = dir_ + "/absent.bin";
  auto tok = LoadLlama2cTokenizer(path, 512);
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(tok.status().message().find(path), std::string::npos) << tok.status();
}

TEST_F(Llama2cTokenizerFileErrorTest, TruncatedCopiesAreDataLossNamingTheFile) {
  RECALL_REQUIRE_SHARED_FILE(kTok512);
  const std::string data = ReadFileOrEmpty(SharedPath(kTok512));
  ASSERT_GT(data.size(), 100u);
  for (size_t size :
       {size_t{0}, size_t{3}, size_t{4}, size_t{9}, size_t{40}, data.size() / 2, data.size() - 1}) {
    const std::string path = dir_ + "/tok512_first" + std::to_string(size) + ".bin";
    testing::WriteFile(path, data.substr(0, size));
    auto tok = LoadLlama2cTokenizer(path, 512);
    ASSERT_FALSE(tok.ok()) << "size " << size;
    EXPECT_EQ(tok.status().code(), absl::StatusCode::kDataLoss) << tok.status();
    EXPECT_NE(tok.status().message().find(path), std::string::npos) << tok.status();
  }
}

TEST_F(Llama2cTokenizerFileErrorTest, CorruptLengthIsDataLoss) {
  RECALL_REQUIRE_SHARED_FILE(kTok512);
  std::string data = ReadFileOrEmpty(SharedPath(kTok512));
  const int32_t huge = 1 << 30;
  std::memcpy(data.data() + 4 + 4, &huge, 4);  // length of token 0
  const std::string path = dir_ + "/corrupt.bin";
  testing::WriteFile(path, data);
  auto tok = LoadLlama2cTokenizer(path, 512);
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(tok.status().message().find("token 0"), std::string::npos) << tok.status();
  // A vocab_size larger than the file holds is also a truncation.
  auto big = LoadLlama2cTokenizer(SharedPath(kTok512), 513);
  ASSERT_FALSE(big.ok());
  EXPECT_EQ(big.status().code(), absl::StatusCode::kDataLoss) << big.status();
}

// Issue 27: a checkpoint header with vocab_size 1 or 8 read only that many tokens of
// tok512.bin, and encoding then produced byte-fallback ids up to 258 and indexed past them.
TEST_F(Llama2cTokenizerFileErrorTest, MoreTokensThanTheModelsVocabSizeIsInvalidArgument) {
  RECALL_REQUIRE_SHARED_FILE(kTok512);
  for (int vocab : {1, 8, 511}) {
    auto tok = LoadLlama2cTokenizer(SharedPath(kTok512), vocab);
    ASSERT_FALSE(tok.ok()) << vocab;
    EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument) << tok.status();
    EXPECT_NE(tok.status().message().find(SharedPath(kTok512) + ": holds more than vocab_size = " +
                                          std::to_string(vocab) + " tokens"),
              std::string::npos)
        << tok.status();
  }
}

TEST_F(Llama2cTokenizerFileErrorTest, AVocabularyTooSmallForByteFallbackEncodesUnknownBytesAsUnk) {
  RECALL_REQUIRE_SHARED_FILE(kTok512);
  // The first 8 tokens of tok512.bin as a whole file: <unk>, <s>, </s>, <0x00>..<0x04>.
  const std::string data = ReadFileOrEmpty(SharedPath(kTok512));
  size_t pos = 4;
  for (int i = 0; i < 8; ++i) {
    int32_t len = 0;
    std::memcpy(&len, data.data() + pos + 4, 4);
    pos += 8 + len;
  }
  const std::string path = dir_ + "/tok8.bin";
  testing::WriteFile(path, data.substr(0, pos));
  auto tok = LoadLlama2cTokenizer(path, 8);
  ASSERT_TRUE(tok.ok()) << tok.status();
  // 'O' (0x4F) would fall back to id 82 and '\x01' to id 4, which this vocabulary holds.
  EXPECT_EQ((*tok)->Encode("O\x01", /*add_bos=*/true), (std::vector<int32_t>{1, 0, 4}));
}

}  // namespace
}  // namespace recall::model
