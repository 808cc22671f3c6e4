// UTF-8 helpers (validity per Unicode Table 3-7; lossy replacement per maximal subpart, as
// Rust's from_utf8_lossy) and NFC.
#include "common/utf8.h"

#include "gtest/gtest.h"
#include "worker/tokenizer/tokenizer_nfc.h"

namespace recall::utf8 {
namespace {

constexpr char kFffd[] = "\xEF\xBF\xBD";

TEST(Utf8Test, ValidityFollowsTable3_7) {
  EXPECT_TRUE(IsValid(""));
  EXPECT_TRUE(IsValid("a\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80"));
  EXPECT_FALSE(IsValid("\xC0\xAF"));          // overlong
  EXPECT_FALSE(IsValid("\xED\xA0\x80"));      // surrogate
  EXPECT_FALSE(IsValid("\xF4\x90\x80\x80"));  // above U+10FFFF
  EXPECT_FALSE(IsValid("\xE4\xB8"));          // cut short
}

TEST(Utf8Test, LossyReplacesEachMaximalSubpart) {
  EXPECT_EQ(ToValidLossy("ok"), "ok");
  EXPECT_EQ(ToValidLossy("\xF0\x9F\x98 x"), std::string(kFffd) + " x");  // one for 3 bytes
  EXPECT_EQ(ToValidLossy("\xFF\xFE"), std::string(kFffd) + kFffd);
  EXPECT_EQ(ToValidLossy("\xED\xA0\x80"), std::string(kFffd) + kFffd + kFffd);
  EXPECT_EQ(ToValidLossy("a\xE4\xB8"), std::string("a") + kFffd);
}

TEST(Utf8Test, CodePointsRoundTrip) {
  for (char32_t cp : {U'\0', U'A', U'\u00E9', U'\u4E2D', U'\U0001F600', U'\U0010FFFF'}) {
    std::string s;
    AppendCodePoint(cp, &s);
    size_t pos = 0;
    EXPECT_EQ(DecodeCodePoint(s, &pos), static_cast<int32_t>(cp));
    EXPECT_EQ(pos, s.size());
  }
  size_t pos = 0;
  EXPECT_EQ(DecodeCodePoint("\x80", &pos), -1);
  EXPECT_EQ(pos, 1u);
}

}  // namespace
}  // namespace recall::utf8

namespace recall::model {
namespace {

// Expected values are Python's unicodedata.normalize("NFC", ...).
TEST(NfcTest, ComposesReordersAndDecomposesSingletons) {
  EXPECT_EQ(ToNfc("plain ascii"), "plain ascii");
  EXPECT_EQ(ToNfc("\xE1\x84\x92\xE1\x85\xA1\xE1\x86\xAB"), "\xED\x95\x9C");  // Hangul L V T
  EXPECT_EQ(ToNfc("a\xCC\x82\xCC\xA3"), "\xE1\xBA\xAD");  // a + circumflex + dot below
  EXPECT_EQ(ToNfc("e\xCC\x81"), "\xC3\xA9");
  EXPECT_EQ(ToNfc("\xE2\x84\xAB"), "\xC3\x85");       // ANGSTROM SIGN -> A with ring
  EXPECT_EQ(ToNfc("A\xCC\x8A\xCC\x81"), "\xC7\xBA");  // two-step composition
  EXPECT_EQ(ToNfc("\xCD\x84"), "\xCC\x88\xCC\x81");   // excluded from recomposition
  EXPECT_EQ(ToNfc("x\xCC\x81\xCC\x81"), "x\xCC\x81\xCC\x81");
  EXPECT_EQ(ToNfc("\xFF"
                  "e\xCC\x81"),
            "\xFF\xC3\xA9");  // ill-formed bytes are kept
}

}  // namespace
}  // namespace recall::utf8
