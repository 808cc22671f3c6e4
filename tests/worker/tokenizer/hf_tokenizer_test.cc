// Hugging Face tokenizer.json (byte-level BPE) against goldens written by the official
// `tokenizers` library (tools/tokenizer_goldens), plus round trips, speed and errors.
#include <chrono>
#include <iostream>
#include <random>
#include <thread>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"
#include "tests/worker/tokenizer/tokenizer_test_util.h"
#include "worker/tokenizer/tokenizer.h"

namespace recall::model {
namespace {

using nlohmann::json;
using ::recall::testing::SharedPath;

constexpr char kSmolLm2[] = "tokenizers/smollm2/tokenizer.json";

// The variant rules of tools/tokenizer_goldens/make_goldens.js.
json ApplyVariant(json base, const json& variant) {
  const json patch = variant.value("patch", json::object());
  const json added_tokens = variant.value("added_tokens", json::object());
  for (const auto& [key, value] : patch.items()) {
    if (key == "model") {
      for (const auto& [k, v] : value.items()) base["model"][k] = v;
    } else {
      base[key] = value;
    }
  }
  for (const auto& [content, fields] : added_tokens.items()) {
    for (json& token : base["added_tokens"]) {
      if (token["content"] == content) {
        for (const auto& [k, v] : fields.items()) token[k] = v;
      }
    }
  }
  if (variant.value("merges_as_pairs", false)) {
    for (json& merge : base["model"]["merges"]) {
      const std::string m = merge.get<std::string>();
      merge = json::array({m.substr(0, m.find(' ')), m.substr(m.find(' ') + 1)});
    }
  }
  return base;
}

// Stands in for a variant that failed to load (so its tests fail instead of crashing).
class BrokenTokenizer final : public Tokenizer {
 public:
  std::vector<int32_t> Encode(std::string_view, bool, bool) const override { return {-1}; }
  std::string Decode(const std::vector<int32_t>&, bool) const override { return "<broken>"; }
  std::string TokenBytes(int32_t, int32_t) const override { return "<broken>"; }
  int vocab_size() const override { return 0; }
  int32_t bos_id() const override { return -2; }
  int32_t eos_id() const override { return -2; }
  std::optional<int32_t> PieceToId(std::string_view) const override { return std::nullopt; }
};

// Loads the shared tokenizer once and writes each variant to a temp dir.
class HfTokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!std::filesystem::exists(SharedPath(kSmolLm2))) return;
    dir_ = new std::string(::recall::testing::MakeTempDir("hf_variants"));
    const json base = testing::ReadJsonFile(SharedPath(kSmolLm2));
    tokenizers_ = new std::map<std::string, std::unique_ptr<Tokenizer>>();
    for (const json& variant : testing::ReadJsonFile(testing::TestdataPath("hf_variants.json"))) {
      const std::string name = variant["name"];
      std::string path = SharedPath(kSmolLm2);  // the real file, with its config.json beside
      if (!variant["patch"].empty() || variant.contains("added_tokens")) {
        path = *dir_ + "/" + name + ".json";
        testing::WriteFile(path, ApplyVariant(base, variant).dump());
      }
      auto tok = LoadHfTokenizer(path);
      if (tok.ok()) {
        (*tokenizers_)[name] = *std::move(tok);
      } else {
        ADD_FAILURE() << name << ": " << tok.status();
      }
    }
  }
  static void TearDownTestSuite() {
    delete tokenizers_;
    tokenizers_ = nullptr;
    if (dir_ != nullptr) std::filesystem::remove_all(*dir_);
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override { RECALL_REQUIRE_SHARED_FILE(kSmolLm2); }

  // The variant's tokenizer; a failed load was reported in SetUpTestSuite.
  static const Tokenizer& Get(const std::string& name) {
    static const Tokenizer* broken = new BrokenTokenizer();
    auto it = tokenizers_->find(name);
    return it == tokenizers_->end() ? *broken : *it->second;
  }

  static std::string* dir_;
  static std::map<std::string, std::unique_ptr<Tokenizer>>* tokenizers_;
};
std::string* HfTokenizerTest::dir_ = nullptr;
std::map<std::string, std::unique_ptr<Tokenizer>>* HfTokenizerTest::tokenizers_ = nullptr;

TEST_F(HfTokenizerTest, SmolLm2VocabularyAndSpecialIds) {
  const Tokenizer& tok = Get("smollm2");
  EXPECT_EQ(tok.vocab_size(), 49152);
  EXPECT_EQ(tok.bos_id(), -1);  // its post_processor adds nothing
  EXPECT_EQ(tok.eos_id(), 2);   // config.json: eos_token_id 2 (<|im_end|>)
  EXPECT_EQ(tok.PieceToId("<|im_start|>"), 1);
  EXPECT_EQ(tok.PieceToId("<|im_end|>"), 2);
  EXPECT_EQ(tok.PieceToId("\xC4\xA0t"), 252);  // "Ġt", the first merge
  EXPECT_EQ(tok.PieceToId("not a token at all"), std::nullopt);
  EXPECT_EQ(Get("llama3_style").bos_id(), 0);  // TemplateProcessing puts <|endoftext|> first
}

// A NUL byte is a byte (byte-level BPE), not the end of the text.
TEST_F(HfTokenizerTest, ANulByteIsEncodedNotAnEnd) {
  const Tokenizer& tok = Get("smollm2");
  const std::string text("hi\0 there", 9);
  EXPECT_EQ(tok.Decode(tok.Encode(text, false)), text);
}

TEST_F(HfTokenizerTest, IdsAndDecodesEqualTheReferenceGoldens) {
  const json golden = testing::ReadJsonFile(testing::TestdataPath("smollm2_goldens.json"));
  const std::vector<std::string> corpus = testing::LoadCorpus();
  int checked = 0;
  for (const json& c : golden["cases"]) {
    const Tokenizer& tok = Get(c["variant"]);
    const bool parse_special = c["parse_special"];
    const bool add_special = c["add_special_tokens"];
    SCOPED_TRACE(c["variant"].get<std::string>() + (parse_special ? "" : " no-special") +
                 (add_special ? " add-special" : ""));
    ASSERT_EQ(c["ids"].size(), corpus.size()) << "goldens are stale: rerun make_goldens.js";
    for (size_t i = 0; i < corpus.size(); ++i) {
      const std::vector<int32_t> expected = c["ids"][i];
      const std::vector<int32_t> ids = tok.Encode(corpus[i], add_special, parse_special);
      EXPECT_EQ(ids, expected) << "corpus[" << i << "] = " << json(corpus[i]).dump();
      // Decodes equal the reference's, except that we drop a leading BOS (our contract).
      auto reference_decode = [&](const std::vector<int32_t>& decoded_ids, const json& text,
                                  bool skip_special) {
        std::string s = text.get<std::string>();
        if (!skip_special && !decoded_ids.empty() && decoded_ids[0] == tok.bos_id()) {
          const std::string bos_text = tok.TokenBytes(tok.bos_id(), tok.bos_id());
          EXPECT_EQ(s.substr(0, bos_text.size()), bos_text);
          s.erase(0, bos_text.size());
        }
        return s;
      };
      EXPECT_EQ(tok.Decode(expected), reference_decode(expected, c["decoded"][i], false)) << i;
      EXPECT_EQ(tok.Decode(expected, true),
                reference_decode(expected, c["decoded_skip_special"][i], true))
          << i;
      if (!expected.empty()) {
        const std::vector<int32_t> drop_last(expected.begin(), expected.end() - 1);
        EXPECT_EQ(tok.Decode(drop_last),
                  reference_decode(drop_last, c["decoded_drop_last"][i], false))
            << i;
      }
      ++checked;
    }
  }
  EXPECT_GE(checked, 7 * static_cast<int>(corpus.size()));
}

TEST_F(HfTokenizerTest, DecodeOfEncodeIsTheText) {
  int checked = 0;
  for (const json& variant : testing::ReadJsonFile(testing::TestdataPath("hf_variants.json"))) {
    if (!variant["roundtrip"].get<bool>()) continue;
    const Tokenizer& tok = Get(variant["name"]);
    SCOPED_TRACE(variant["name"].get<std::string>());
    for (const std::string& text : testing::LoadCorpus()) {
      const std::vector<int32_t> ids = tok.Encode(text, false);
      std::string expected = text;
      if (!ids.empty() && ids[0] == tok.bos_id()) {  // a leading BOS is not decoded
        expected.erase(0, tok.TokenBytes(tok.bos_id(), tok.bos_id()).size());
      }
      EXPECT_EQ(tok.Decode(ids), expected);
      EXPECT_EQ(tok.Decode(tok.Encode(text, true)), text);  // the added BOS is dropped
      EXPECT_EQ(tok.Decode(tok.Encode(text, false, false)), text);
      ++checked;
    }
  }
  EXPECT_GE(checked, 100);
}

TEST_F(HfTokenizerTest, StreamingGivesTheDecodedTextInValidPieces) {
  const Tokenizer& tok = Get("smollm2");
  for (const std::string& text : testing::LoadCorpus()) {
    const std::vector<int32_t> ids = tok.Encode(text, false);
    TokenStreamDecoder stream(tok);
    std::string streamed;
    for (int32_t id : ids) {
      const std::string piece = stream.Next(id);
      EXPECT_TRUE(testing::IsValidUtf8(piece)) << json(text).dump();
      streamed += piece;
    }
    streamed += stream.Flush();
    EXPECT_EQ(streamed, text);
  }
}

TEST_F(HfTokenizerTest, TokenBytesAreRawBytes) {
  const Tokenizer& tok = Get("smollm2");
  const std::vector<int32_t> ids = tok.Encode("\xF0\x9F\x98\x80", false);  // one emoji
  ASSERT_GE(ids.size(), 2u);
  std::string bytes;
  for (int32_t id : ids) bytes += tok.TokenBytes(-1, id);
  EXPECT_EQ(bytes, "\xF0\x9F\x98\x80");
  EXPECT_EQ(tok.TokenBytes(-1, 1), "<|im_start|>");
  EXPECT_EQ(tok.TokenBytes(-1, 216), " ");  // "Ġ"
}

// A fresh tokenizer (cold BPE cache) on 100 KB of corpus lines and random words.
TEST_F(HfTokenizerTest, HundredKilobytesEncodeWellUnderASecond) {
  auto fresh = LoadHfTokenizer(SharedPath(kSmolLm2));
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  const Tokenizer& tok = **fresh;
  const std::vector<std::string> corpus = testing::LoadCorpus();
  const std::vector<std::string> letters = {
      "a", "e", "i", "o", "u", "t", "n", "s", "r", "k", "\xC3\xA9", "\xC3\xB6", "\xE4\xB8\xAD",
      "Q", "Z"};
  std::mt19937 rng(7);
  std::string text;
  while (text.size() < 100 * 1024) {
    if (rng() % 4 == 0) {
      text += corpus[rng() % corpus.size()];
    } else {
      for (int n = 1 + rng() % 12; n > 0; --n) text += letters[rng() % letters.size()];
    }
    text += (rng() % 8 == 0) ? '\n' : ' ';
  }
  const auto start = std::chrono::steady_clock::now();
  const std::vector<int32_t> ids = tok.Encode(text, false);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::cout << "[ timing   ] encoded " << text.size() << " bytes into " << ids.size()
            << " tokens in " << seconds * 1000 << " ms\n";
  EXPECT_LT(seconds, 0.5);
  EXPECT_EQ(tok.Decode(ids), text);
}

// Const methods may run concurrently (the BPE cache is shared): same ids as one thread.
TEST_F(HfTokenizerTest, ConcurrentEncodesAgree) {
  auto fresh = LoadHfTokenizer(SharedPath(kSmolLm2));
  ASSERT_TRUE(fresh.ok()) << fresh.status();
  const Tokenizer& tok = **fresh;
  const std::vector<std::string> corpus = testing::LoadCorpus();
  std::vector<std::vector<std::vector<int32_t>>> results(4);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < results.size(); ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 5; ++round) {
        for (size_t i = 0; i < corpus.size(); ++i) {
          const size_t k = (i + t * 7) % corpus.size();  // different orders per thread
          std::vector<int32_t> ids = tok.Encode(corpus[k], false);
          if (round == 0) results[t].push_back(std::move(ids));
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  const Tokenizer& reference = Get("smollm2");
  for (size_t t = 0; t < results.size(); ++t) {
    for (size_t i = 0; i < corpus.size(); ++i) {
      EXPECT_EQ(results[t][i], reference.Encode(corpus[(i + t * 7) % corpus.size()], false));
    }
  }
}

class HfTokenizerErrorTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = ::recall::testing::MakeTempDir("hf_errors"); }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  absl::Status LoadText(const std::string& name, const std::string& text) {
    const std::string path = dir_ + "/" + name;
    testing::WriteFile(path, text);
    auto tok = LoadHfTokenizer(path);
    if (tok.ok()) return absl::OkStatus();
    EXPECT_NE(tok.status().message().find(path), std::string::npos) << tok.status();
    return tok.status();
  }

  std::string dir_;
};

TEST_F(HfTokenizerErrorTest, MissingFileIsNotFound) {
  auto tok = LoadHfTokenizer(dir_ + "/tokenizer.json");
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(tok.status().message().find(dir_ + "/tokenizer.json"), std::string::npos);
}

TEST_F(HfTokenizerErrorTest, CorruptAndTruncatedJsonIsDataLoss) {
  EXPECT_EQ(LoadText("garbage.json", "{not json").code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(LoadText("array.json", "[1, 2]").code(), absl::StatusCode::kDataLoss);
  RECALL_REQUIRE_SHARED_FILE(kSmolLm2);
  const std::string full = ::recall::testing::ReadFileOrEmpty(SharedPath(kSmolLm2));
  EXPECT_EQ(LoadText("truncated.json", full.substr(0, full.size() / 2)).code(),
            absl::StatusCode::kDataLoss);
}

TEST_F(HfTokenizerErrorTest, MalformedOrUnsupportedContentIsInvalidArgument) {
  const json minimal = {
      {"model", {{"type", "BPE"}, {"vocab", {{"a", 0}, {"b", 1}, {"ab", 2}}}, {"merges", {"a b"}}}},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
      {"decoder", {{"type", "ByteLevel"}}}};
  EXPECT_TRUE(LoadText("minimal.json", minimal.dump()).ok());

  json no_model = minimal;
  no_model.erase("model");
  EXPECT_EQ(LoadText("no_model.json", no_model.dump()).code(), absl::StatusCode::kInvalidArgument);
  json bad_merge = minimal;
  bad_merge["model"]["merges"] = {"a c"};
  EXPECT_EQ(LoadText("bad_merge.json", bad_merge.dump()).code(),
            absl::StatusCode::kInvalidArgument);
  json wordpiece = minimal;
  wordpiece["model"]["type"] = "WordPiece";
  EXPECT_EQ(LoadText("wordpiece.json", wordpiece.dump()).code(),
            absl::StatusCode::kInvalidArgument);
  json metaspace = minimal;
  metaspace["pre_tokenizer"] = {{"type", "Metaspace"}};
  EXPECT_EQ(LoadText("metaspace.json", metaspace.dump()).code(),
            absl::StatusCode::kInvalidArgument);
  json bad_regex = minimal;
  bad_regex["pre_tokenizer"] = {
      {"type", "Sequence"},
      {"pretokenizers",
       {{{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}},
        {{"type", "ByteLevel"}}}}};
  EXPECT_EQ(LoadText("bad_regex.json", bad_regex.dump()).code(),
            absl::StatusCode::kInvalidArgument);
  json bad_type = minimal;
  bad_type["model"]["vocab"]["a"] = "zero";
  EXPECT_EQ(LoadText("bad_type.json", bad_type.dump()).code(), absl::StatusCode::kInvalidArgument);
}

// Llama 3 and Qwen 2.5 name several EOS ids (generation_config.json "eos_token_id": [...]):
// each ends a sequence (only the first did). Ids past the vocabulary are refused
// (eos_ids_test.cc).
TEST_F(HfTokenizerErrorTest, EveryEosIdOfTheModelFilesEndsASequence) {
  const json minimal = {
      {"model", {{"type", "BPE"}, {"vocab", {{"a", 0}, {"b", 1}, {"ab", 2}}}, {"merges", {"a b"}}}},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
      {"decoder", {{"type", "ByteLevel"}}}};
  testing::WriteFile(dir_ + "/tokenizer.json", minimal.dump());
  testing::WriteFile(dir_ + "/generation_config.json", R"({"eos_token_id": [2, 0]})");
  testing::WriteFile(dir_ + "/config.json", R"({"eos_token_id": 1})");
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = LoadHfTokenizer(dir_ + "/tokenizer.json");
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->eos_id(), 2);
  EXPECT_EQ((*tok)->end_ids(), (std::vector<int32_t>{2, 0}));

  std::filesystem::remove(dir_ + "/generation_config.json");  // then config.json's one id
  tok = LoadHfTokenizer(dir_ + "/tokenizer.json");
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ((*tok)->end_ids(), (std::vector<int32_t>{1}));
}

TEST_F(HfTokenizerErrorTest, IdsBeyondTheFileSizeAreRefusedBeforeAllocating) {
  // The id table is sized by the largest id: one id of 2^31 - 1 asked for 64 GiB.
  const json minimal = {
      {"model", {{"type", "BPE"}, {"vocab", {{"a", 0}, {"b", 1}, {"ab", 2}}}, {"merges", {"a b"}}}},
      {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
      {"decoder", {{"type", "ByteLevel"}}}};
  json big_vocab_id = minimal;
  big_vocab_id["model"]["vocab"]["ab"] = 2147483647;
  absl::Status s = LoadText("big_vocab_id.json", big_vocab_id.dump());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("token id 2147483647 is out of range"), std::string::npos) << s;
  json big_added_id = minimal;
  big_added_id["added_tokens"] = {{{"id", 100000000}, {"content", "<x>"}, {"special", true}}};
  s = LoadText("big_added_id.json", big_added_id.dump());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("token id 100000000 is out of range"), std::string::npos) << s;
  // Ids that are no int32 are refused, never converted (a fuzzer found 1.2e20 and 2^64 - 1
  // converted with undefined behaviour).
  for (const json& id : {json(1.18447e20), json(18446744073709551615ull), json(-1), json(1.5)}) {
    json odd = minimal;
    odd["model"]["vocab"]["ab"] = id;
    s = LoadText("odd_id.json", odd.dump());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << id.dump() << ": " << s;
    EXPECT_NE(s.message().find("model.vocab: the id of ab"), std::string::npos) << s;
    json odd_added = minimal;
    odd_added["added_tokens"] = {{{"id", id}, {"content", "<x>"}, {"special", true}}};
    s = LoadText("odd_added.json", odd_added.dump());
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << id.dump() << ": " << s;
  }
  json empty = minimal;
  empty["model"]["vocab"] = json::object();
  empty["model"]["merges"] = json::array();
  EXPECT_EQ(LoadText("empty.json", empty.dump()).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(HfTokenizerErrorTest, DeepNestingIsRefusedBeforeParsing) {
  // Copying a json value recurses per level: a million levels overflowed the stack.
  const std::string deep =
      "{\"normalizer\": " + std::string(1000000, '[') + std::string(1000000, ']') + "}";
  const absl::Status s = LoadText("deep.json", deep);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("JSON nests deeper than 64 levels"), std::string::npos) << s;
}

}  // namespace
}  // namespace recall::model
