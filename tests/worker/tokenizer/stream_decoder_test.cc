// TokenStreamDecoder over a fake tokenizer whose tokens are arbitrary byte strings.
#include "gtest/gtest.h"
#include "worker/tokenizer/tokenizer.h"

namespace recall::model {
namespace {

class BytesTokenizer final : public Tokenizer {
 public:
  explicit BytesTokenizer(std::vector<std::string> pieces) : pieces_(std::move(pieces)) {}
  std::vector<int32_t> Encode(std::string_view, bool, bool) const override { return {}; }
  std::string Decode(const std::vector<int32_t>& ids, bool) const override {
    std::string out;
    for (int32_t id : ids) out += pieces_[id];
    return out;
  }
  std::string TokenBytes(int32_t, int32_t id) const override { return pieces_[id]; }
  int vocab_size() const override { return static_cast<int>(pieces_.size()); }
  int32_t bos_id() const override { return -1; }
  int32_t eos_id() const override { return -1; }
  std::optional<int32_t> PieceToId(std::string_view) const override { return std::nullopt; }

 private:
  std::vector<std::string> pieces_;
};

const BytesTokenizer& Fake() {
  static const BytesTokenizer* tok = new BytesTokenizer({
      "ab",         // 0
      "\xF0\x9F",   // 1: first half of U+1F600
      "\x98\x80",   // 2: second half
      "\xE4",       // 3: first byte of U+4E2D
      "\xB8\xAD!",  // 4: rest of U+4E2D, then '!'
      "\xFF",       // 5: never valid
      "x\xC3",      // 6: 'x' and the lead of a 2-byte character
      "\xA9",       // 7: its continuation (é)
      "\x80",       // 8: a stray continuation byte
      "\xE2\x82",   // 9: first two bytes of €
  });
  return *tok;
}

TEST(TokenStreamDecoderTest, WholeCharactersPassStraightThrough) {
  TokenStreamDecoder stream(Fake());
  EXPECT_EQ(stream.Next(0), "ab");
  EXPECT_EQ(stream.Next(0), "ab");
  EXPECT_EQ(stream.Flush(), "");
}

TEST(TokenStreamDecoderTest, ACharacterSplitOverTokensComesOutWhenComplete) {
  TokenStreamDecoder stream(Fake());
  EXPECT_EQ(stream.Next(1), "");
  EXPECT_EQ(stream.Next(2), "\xF0\x9F\x98\x80");
  EXPECT_EQ(stream.Next(3), "");
  EXPECT_EQ(stream.Next(4), "\xE4\xB8\xAD!");
  EXPECT_EQ(stream.Next(6), "x");
  EXPECT_EQ(stream.Next(7), "\xC3\xA9");
  EXPECT_EQ(stream.Flush(), "");
}

TEST(TokenStreamDecoderTest, InvalidBytesBecomeReplacementCharacters) {
  TokenStreamDecoder stream(Fake());
  EXPECT_EQ(stream.Next(5), "\xEF\xBF\xBD");
  EXPECT_EQ(stream.Next(8), "\xEF\xBF\xBD");
  // A lead byte followed by something that cannot continue it.
  EXPECT_EQ(stream.Next(1), "");
  EXPECT_EQ(stream.Next(0),
            "\xEF\xBF\xBD"
            "ab");
}

TEST(TokenStreamDecoderTest, FlushReturnsAnIncompleteTailAsOneReplacement) {
  TokenStreamDecoder stream(Fake());
  EXPECT_EQ(stream.Next(0), "ab");
  EXPECT_EQ(stream.Next(9), "");
  EXPECT_EQ(stream.Flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(stream.Flush(), "");
  EXPECT_EQ(stream.Next(0), "ab");
}

}  // namespace
}  // namespace recall::model
