// LoadQaConversations and QaSequence: the held-out conversation file is read and tokenized
// as tools/train/train.py feeds it, and every malformed input is refused by line and field.
#include "bench/quality/conversation_set.h"

#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/common/test_util.h"

namespace recall::bench {
namespace {

// One id per byte (byte + 3), BOS 1, EOS 2: lines are easy to check by hand.
class ByteTokenizer final : public model::Tokenizer {
 public:
  std::vector<int32_t> Encode(std::string_view text, bool add_bos, bool) const override {
    std::vector<int32_t> ids;
    if (add_bos) ids.push_back(1);
    for (unsigned char ch : text) ids.push_back(ch + 3);
    return ids;
  }
  std::string Decode(const std::vector<int32_t>& ids, bool) const override {
    std::string s;
    for (int32_t id : ids) {
      if (id >= 3) s += static_cast<char>(id - 3);
    }
    return s;
  }
  std::string TokenBytes(int32_t, int32_t id) const override {
    return id >= 3 ? std::string(1, static_cast<char>(id - 3)) : "";
  }
  int vocab_size() const override { return 259; }
  int32_t bos_id() const override { return 1; }
  int32_t eos_id() const override { return 2; }
  std::optional<int32_t> PieceToId(std::string_view piece) const override {
    if (piece.size() == 1) return static_cast<unsigned char>(piece[0]) + 3;
    return std::nullopt;
  }
};

std::vector<int32_t> Bytes(const std::string& s) {
  std::vector<int32_t> ids;
  for (unsigned char ch : s) ids.push_back(ch + 3);
  return ids;
}

std::string WriteFile(const std::string& name, const std::string& body) {
  const std::string path = testing::MakeTempDir("conversation_set") + "/" + name;
  std::ofstream(path) << body;
  return path;
}

const char kTwo[] =
    R"({"seed": 7, "text": "A: hi\nB: I live in Oslo.\n", "questions": [)"
    R"({"q": "Where does B live?", "a": "Oslo", "kind": "current:city", "distance_tokens": 9},)"
    R"({"q": "Who?", "a": "B"}]})"
    "\n\n"
    R"({"seed": 8, "text": "x\n", "questions": [{"q": "y?", "a": "z"}]})"
    "\n";

TEST(ConversationSetTest, TokenizesAsTheTrainingFormat) {
  ByteTokenizer tok;
  auto convs = LoadQaConversations(WriteFile("two.jsonl", kTwo), tok, 0, 0, 4096);
  ASSERT_TRUE(convs.ok()) << convs.status();
  ASSERT_EQ(convs->size(), 2u);
  const QaConversation& c = (*convs)[0];
  EXPECT_EQ(c.seed, 7u);
  std::vector<int32_t> want = {1};
  for (const char* line : {"A: hi\n", "B: I live in Oslo.\n"}) {
    for (int32_t id : Bytes(line)) want.push_back(id);
  }
  EXPECT_EQ(c.conversation_tokens, static_cast<int>(want.size()));
  for (int32_t id : Bytes("[Questions]\n")) want.push_back(id);
  EXPECT_EQ(c.context, want);
  ASSERT_EQ(c.questions.size(), 2u);
  EXPECT_EQ(c.questions[0].ask, Bytes("Q: Where does B live?\nA:"));
  EXPECT_EQ(c.questions[0].answer, Bytes(" Oslo\n"));
  EXPECT_EQ(c.questions[0].kind, "current:city");
  EXPECT_EQ(c.questions[0].distance_tokens, 9);
  EXPECT_EQ(c.questions[1].answer, Bytes(" B\n"));

  std::vector<int> starts;
  const std::vector<int32_t> seq = QaSequence(c, &starts);
  ASSERT_EQ(starts.size(), 2u);
  EXPECT_EQ(std::vector<int32_t>(seq.begin() + starts[0], seq.begin() + starts[0] + 6),
            Bytes(" Oslo\n"));
  EXPECT_EQ(std::vector<int32_t>(seq.begin() + starts[1], seq.end()), Bytes(" B\n"));
  EXPECT_EQ(seq.size(),
            c.context.size() + c.questions[0].ask.size() + 6 + c.questions[1].ask.size() + 3);
}

TEST(ConversationSetTest, CapsConversationsAndQuestions) {
  ByteTokenizer tok;
  auto convs = LoadQaConversations(WriteFile("two.jsonl", kTwo), tok, 1, 1, 4096);
  ASSERT_TRUE(convs.ok()) << convs.status();
  ASSERT_EQ(convs->size(), 1u);
  EXPECT_EQ((*convs)[0].questions.size(), 1u);
}

TEST(ConversationSetTest, RefusesBadInputByLineAndField) {
  ByteTokenizer tok;
  auto missing = LoadQaConversations("/nonexistent/x.jsonl", tok, 0, 0, 4096);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);

  const std::string good = R"({"text": "x\n", "questions": [{"q": "y?", "a": "z"}]})";
  struct Case {
    std::string second_line, needle;
  };
  for (const Case& c : std::vector<Case>{
           {"not json", "two.jsonl:2: not a JSON object"},
           {R"({"questions": [{"q": "y?", "a": "z"}]})", "'text'"},
           {R"({"text": "x\n"})", "'questions'"},
           {R"({"text": "x\n", "questions": []})", "'questions'"},
           {R"({"text": "x\n", "questions": [{"a": "z"}]})", "question 0: field 'q'"},
           {R"({"text": "x\n", "questions": [{"q": "y?", "a": ""}]})", "field 'a' is empty"}}) {
    auto r = LoadQaConversations(WriteFile("two.jsonl", good + "\n" + c.second_line + "\n"), tok, 0,
                                 0, 4096);
    ASSERT_FALSE(r.ok()) << c.second_line;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_NE(r.status().message().find(c.needle), std::string::npos) << r.status();
  }
  auto too_long = LoadQaConversations(WriteFile("two.jsonl", kTwo), tok, 0, 0, 40);
  EXPECT_EQ(too_long.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(too_long.status().message().find("context of 40"), std::string::npos);
  auto empty = LoadQaConversations(WriteFile("empty.jsonl", "\n"), tok, 0, 0, 4096);
  EXPECT_EQ(empty.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace recall::bench
