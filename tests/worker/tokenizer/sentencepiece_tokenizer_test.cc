// SentencePiece tokenizer.model: our wrapper against libsentencepiece itself, and the
// llama2.c tokenizer.bin of the same vocabulary against both.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"
#include "tests/worker/tokenizer/sp_reference.h"
#include "tests/worker/tokenizer/tokenizer_test_util.h"
#include "worker/tokenizer/tokenizer.h"
#include "worker/tokenizer/tokenizer_sentencepiece_charsmap.h"

namespace recall::model {
namespace {

using ::recall::testing::SharedPath;

constexpr char kModel[] = "tokenizers/llama2-32k/tokenizer.model";
constexpr char kBin[] = "tokenizers/llama2-32k/tokenizer.bin";

class SentencePieceTokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    RECALL_REQUIRE_SHARED_FILE(kModel);
    auto tok = LoadSentencePieceTokenizer(SharedPath(kModel));
    ASSERT_TRUE(tok.ok()) << tok.status();
    tok_ = *std::move(tok);
    reference_ = std::make_unique<testing::SentencePieceReference>(SharedPath(kModel));
    ASSERT_EQ(reference_->error(), "");
  }

  std::vector<int32_t> Reference(const std::string& text, bool add_bos) const {
    std::vector<int32_t> ids;
    if (add_bos) ids.push_back(1);
    for (int id : reference_->Encode(text)) ids.push_back(id);
    return ids;
  }

  std::unique_ptr<Tokenizer> tok_;
  std::unique_ptr<testing::SentencePieceReference> reference_;
};

TEST_F(SentencePieceTokenizerTest, VocabularyAndSpecialIds) {
  EXPECT_EQ(tok_->vocab_size(), 32000);
  EXPECT_EQ(tok_->bos_id(), 1);
  EXPECT_EQ(tok_->eos_id(), 2);
  EXPECT_EQ(tok_->PieceToId("\xE2\x96\x81the"), 278);  // "▁the"
  EXPECT_EQ(tok_->PieceToId("<unk>"), 0);
  EXPECT_EQ(tok_->PieceToId("definitely-not-a-piece"), std::nullopt);
}

TEST_F(SentencePieceTokenizerTest, EncodeAndDecodeMatchTheLibraryOnTheCorpus) {
  for (const std::string& text : testing::LoadCorpus()) {
    const std::vector<int32_t> ids = tok_->Encode(text, true, false);
    EXPECT_EQ(ids, Reference(text, true)) << text;
    EXPECT_EQ(tok_->Encode(text, false, true), Reference(text, false)) << text;  // no "<s>"
    const std::vector<int> ref_ids(ids.begin(), ids.end());
    EXPECT_EQ(tok_->Decode(ids), reference_->Decode(ref_ids)) << text;
  }
}

// A NUL byte does not end the text: what follows it is encoded too (as the library does).
TEST_F(SentencePieceTokenizerTest, ANulByteIsNotTheEndOfTheText) {
  const std::string text("hi\0 there", 9);
  EXPECT_EQ(tok_->Encode(text, true), Reference(text, true));
  EXPECT_NE(tok_->Decode(tok_->Encode(text, false)).find("there"), std::string::npos);
}

TEST_F(SentencePieceTokenizerTest, StreamingAfterBosMatchesDecode) {
  for (const std::string& text : testing::LoadCorpus()) {
    const std::vector<int32_t> ids = tok_->Encode(text, true);
    TokenStreamDecoder stream(*tok_);
    std::string streamed;
    for (int32_t id : ids) streamed += stream.Next(id);
    streamed += stream.Flush();
    EXPECT_EQ(streamed, tok_->Decode(ids)) << text;
  }
}

TEST_F(SentencePieceTokenizerTest, ParseSpecialTurnsLiteralMarkersIntoBosAndEos) {
  std::vector<int32_t> expected = {1};
  // The text between the markers is one segment, encoded with its own dummy prefix.
  for (int32_t id : Reference("[INST] hi [/INST] ok ", false)) expected.push_back(id);
  expected.push_back(2);
  EXPECT_EQ(tok_->Encode("<s>[INST] hi [/INST] ok </s>", false, true), expected);
  EXPECT_EQ(tok_->Encode("<s>x</s>", false, false), Reference("<s>x</s>", false));
}

// The llama2.c export of the same vocabulary encodes like SentencePiece wherever both are
// plain BPE over the same pieces and scores: ASCII text.
TEST_F(SentencePieceTokenizerTest, Llama2cBinOfTheSameVocabularyAgreesOnAscii) {
  RECALL_REQUIRE_SHARED_FILE(kBin);
  auto bin = LoadLlama2cTokenizer(SharedPath(kBin), 32000);
  ASSERT_TRUE(bin.ok()) << bin.status();
  int compared = 0;
  std::vector<std::string> texts = testing::LoadCorpus();
  texts.push_back("The model said: \"It's 3:45pm; let's go!\" (really?)\n\tIndented line.");
  texts.push_back("snake_case, CamelCase, kebab-case; x = y * 2 + z[0] / 7 % 3");
  for (const std::string& text : texts) {
    if (text.empty() || !testing::IsAscii(text)) continue;
    const std::vector<int32_t> ids = (*bin)->Encode(text, true, false);
    EXPECT_EQ(ids, Reference(text, true)) << text;
    // run.c prints no unprintable single bytes; where there are none the texts agree.
    const bool printable = std::all_of(text.begin(), text.end(), [](char c) {
      return (c >= 0x20 && c < 0x7F) || c == '\t' || c == '\n' || c == '\r';
    });
    if (printable) {
      EXPECT_EQ((*bin)->Decode(ids), tok_->Decode(ids)) << text;
    }
    ++compared;
  }
  EXPECT_GE(compared, 30);
}

TEST(SentencePieceTokenizerErrorTest, MissingAndCorruptFiles) {
  const std::string dir = ::recall::testing::MakeTempDir("sp_errors");
  auto missing = LoadSentencePieceTokenizer(dir + "/absent.model");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find(dir + "/absent.model"), std::string::npos);

  const std::string corrupt = dir + "/corrupt.model";
  testing::WriteFile(corrupt, "this is not a protobuf \xFF\xFF\xFF\xFF");
  auto bad = LoadSentencePieceTokenizer(corrupt);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kDataLoss) << bad.status();
  EXPECT_NE(bad.status().message().find(corrupt), std::string::npos);
  std::filesystem::remove_all(dir);
}

// Found by fuzz/sentencepiece_fuzzer: a BPE model whose seventh piece is "\0\0\0\0" (empty
// as a C string) makes libsentencepiece's trie builder throw Darts::Details::Exception out of
// LoadFromSerializedProto, which terminated the process.
TEST(SentencePieceTokenizerErrorTest, APieceThatMakesTheLibraryThrowIsDataLoss) {
  static constexpr char kModel[] =
      "\012\016\012\005<unk>\025\000\000\000\000\030\002\012\014\012\003<s>\025\000\000"
      "\000\000\030\003\012\015\012\004</s>\025\000\000\000\000\030\003\012\014\012\003"
      "\342\226\201\025\000\000\200\277\030\001\012\012\012\001a\025\000\000\000\300\030"
      "\001\012\012\012\001b\025\000\000@\300\030\001\012\012\012\004\000\000\000\000\200"
      "\300\030\013\210\002\000\300\002\000\310\002\001\320\002\002\330\002\377\377\377"
      "\377\377\377\377\377\377\001\032\020\012\010identity\030\001 \000(\001";
  const std::string dir = ::recall::testing::MakeTempDir("sp_throws");
  const std::string path = dir + "/tokenizer.model";
  testing::WriteFile(path, std::string(kModel, sizeof(kModel) - 1));
  auto tok = LoadSentencePieceTokenizer(path);
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kDataLoss) << tok.status();
  EXPECT_NE(tok.status().message().find(path + ": not a valid SentencePiece model "
                                               "(libsentencepiece threw: "),
            std::string::npos)
      << tok.status();
  std::filesystem::remove_all(dir);
}

// The normalization table (precompiled_charsmap) of a model trained with each of the
// trainer's rules loads and encodes as the library does; a damaged one (a trie of no units,
// units that lead past the table, a string that does not end) is refused by name. The library
// walks it unchecked: such a table crashed the process at its first Encode.
TEST(SentencePieceTokenizerErrorTest, NormalizationTablesAreCheckedBeforeTheLibraryWalksThem) {
  const std::string dir = ::recall::testing::MakeTempDir("sp_charsmap");
  std::string text;
  const char* words[] = {"once",        "upon",           "a",
                         "time",        "Lily",           "\xEF\xBC\xA1\xEF\xBC\xA2",
                         "caf\xC3\xA9", "\xEF\xAC\x81ne", "\xE2\x91\xA0"};  // ＡＢ, café, ﬁne, ①
  for (int line = 0; line < 200; ++line) {
    for (int w = 0; w < 10; ++w) text += std::string(words[(line * 7 + w * 3) % 9]) + " ";
    text += "\n";
  }
  testing::WriteFile(dir + "/text.txt", text);
  const std::string sample =
      "\xEF\xBC\xA1\xEF\xBC\xA2 caf\xC3\xA9 \xEF\xAC\x81ne \xE2\x91\xA0 Lily";
  std::string good;
  for (const char* rule : {"nmt_nfkc", "nfkc_cf"}) {
    SCOPED_TRACE(rule);
    const std::string prefix = dir + "/" + rule;
    ASSERT_EQ(
        testing::TrainSentencePieceModel("--input=" + dir + "/text.txt --model_prefix=" + prefix +
                                         " --vocab_size=30 --normalization_rule_name=" + rule),
        "");
    auto tok = LoadSentencePieceTokenizer(prefix + ".model");
    ASSERT_TRUE(tok.ok()) << tok.status();
    testing::SentencePieceReference reference(prefix + ".model");
    ASSERT_EQ(reference.error(), "");
    const std::vector<int32_t> ids = (*tok)->Encode(sample, false, false);
    EXPECT_EQ(std::vector<int>(ids.begin(), ids.end()), reference.Encode(sample));
    good = ::recall::testing::ReadFileOrEmpty(prefix + ".model");
  }
  // The table as the trainer wrote it: the normalizer spec's name (field 1), then the table
  // (field 2, length-delimited): a uint32 of the trie's bytes, the trie, the strings.
  const std::string spec_start("\x0a\x07nfkc_cf\x12", 10);
  const size_t name = good.find(spec_start);
  ASSERT_NE(name, std::string::npos);
  size_t at = name + spec_start.size();
  uint64_t length = 0;
  for (int shift = 0;; shift += 7) {
    const auto b = static_cast<uint8_t>(good.at(at++));
    length |= static_cast<uint64_t>(b & 0x7f) << shift;
    if ((b & 0x80) == 0) break;
  }
  const size_t blob = at;
  ASSERT_LE(blob + length, good.size());
  uint32_t trie_bytes = 0;
  std::memcpy(&trie_bytes, good.data() + blob, 4);
  ASSERT_GT(trie_bytes, 1024u);
  ASSERT_LT(trie_bytes + 4, length);
  const struct {
    const char* what;
    std::function<void(std::string&)> damage;
    const char* said;
  } cases[] = {
      {"no units", [&](std::string& m) { std::memset(m.data() + blob, 0, 4); },
       "its trie is empty"},
      {"units leading past the table",
       [&](std::string& m) { std::memset(m.data() + blob + 4, 0xff, 64); },
       "its trie leads past its "},
      {"strings without their ends",
       [&](std::string& m) {
         std::replace(m.begin() + blob + 4 + trie_bytes, m.begin() + blob + length, '\0', 'x');
       },
       "which does not end there"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.what);
    std::string damaged = good;
    c.damage(damaged);
    const std::string path = dir + "/damaged.model";
    testing::WriteFile(path, damaged);
    auto tok = LoadSentencePieceTokenizer(path);
    ASSERT_FALSE(tok.ok());
    EXPECT_EQ(tok.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(tok.status().message().find(path + ": not a valid SentencePiece model "
                                                 "(normalizer_spec.precompiled_charsmap: "),
              std::string::npos)
        << tok.status();
    EXPECT_NE(tok.status().message().find(c.said), std::string::npos) << tok.status();
  }
  std::filesystem::remove_all(dir);
}

// Tries that stay inside their table but that the library would still walk off its stack: a
// cycle (an input matching without end), and a path of more than 32 matches (its search keeps
// 32 and reports them all). Built by hand, unit by unit, as darts-clone lays them out.
std::string Varint(uint64_t v) {
  std::string out;
  for (; v >= 0x80; v >>= 7) out.push_back(static_cast<char>((v & 0x7f) | 0x80));
  out.push_back(static_cast<char>(v));
  return out;
}

// A ModelProto holding only a normalizer_spec with this table (`units`, then "x\0").
std::string ModelWithTable(const std::vector<uint32_t>& units) {
  std::string blob(4, '\0');
  const uint32_t bytes = static_cast<uint32_t>(units.size() * 4);
  std::memcpy(blob.data(), &bytes, 4);
  blob.append(reinterpret_cast<const char*>(units.data()), bytes);
  blob.append("x\0", 2);
  const std::string spec = "\x12" + Varint(blob.size()) + blob;
  return "\x1a" + Varint(spec.size()) + spec;
}

// Unit fields: a node with a match (has_leaf) for byte `label` whose children are at `offset`.
uint32_t Node(uint32_t label, uint32_t offset) { return (offset << 10) | (1u << 8) | label; }
constexpr uint32_t kValue0 = 1u << 31;  // a value unit: the string at byte 0

// The root's children in block 1; each 'a' a match, leading to the next block.
std::vector<uint32_t> ChainOfMatches(int matches) {
  std::vector<uint32_t> units(256 * (matches + 2), 0);
  units[0] = 256u << 10;  // the root: its children at 256
  for (int k = 1; k <= matches; ++k) {
    const uint32_t state = 256u * k, at = state ^ 'a', next = 256u * (k + 1);
    units[state] = kValue0;  // (label 0 is no byte's)
    units[at] = Node('a', at ^ next);
  }
  units[256u * (matches + 1)] = kValue0;
  return units;
}

TEST(SentencePieceTokenizerErrorTest, TriesThatWouldOverrunTheLibrarysResultsAreRefused) {
  EXPECT_TRUE(internal::CheckCharsMaps(ModelWithTable(ChainOfMatches(32))).ok());
  const absl::Status long_chain = internal::CheckCharsMaps(ModelWithTable(ChainOfMatches(33)));
  EXPECT_EQ(long_chain.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(long_chain.message(),
            "normalizer_spec.precompiled_charsmap: an input matches more than 32 of its entries");
  std::vector<uint32_t> loop = ChainOfMatches(1);
  loop[256 ^ 'a'] = Node('a', (256 ^ 'a') ^ 256);  // 'a' leads back to the state it left
  EXPECT_EQ(internal::CheckCharsMaps(ModelWithTable(loop)).message(),
            "normalizer_spec.precompiled_charsmap: its trie has a cycle (at unit 256)");
  // A group before the spec (the library skips it) does not hide the table.
  EXPECT_EQ(internal::CheckCharsMaps("\x0b\x08\x01\x0c" + ModelWithTable(loop)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(
      internal::CheckCharsMaps("\x0b\x08\x01\x0c" + ModelWithTable(ChainOfMatches(2))).ok());
}

}  // namespace
}  // namespace recall::model
