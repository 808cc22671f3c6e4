#include "cache/episodic/embedder.h"

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace recall::cache::episodic {
namespace {

class HashedTfIdfEmbedderTest : public ::testing::Test {
 protected:
  static std::unique_ptr<HashedTfIdfEmbedder> Make(int dim = 1024, uint64_t seed = 0) {
    absl::StatusOr<std::unique_ptr<HashedTfIdfEmbedder>> e =
        HashedTfIdfEmbedder::Create({.dim = dim, .seed = seed});
    EXPECT_TRUE(e.ok()) << e.status();
    return e.ok() ? std::move(*e) : nullptr;
  }

  static std::vector<float> Embed(const Embedder& e, const std::string& text) {
    absl::StatusOr<std::vector<float>> v = e.Embed(text);
    EXPECT_TRUE(v.ok()) << v.status();
    return v.ok() ? *v : std::vector<float>{};
  }

  static double Dot(const std::vector<float>& a, const std::vector<float>& b) {
    double d = 0.0;
    for (size_t i = 0; i < a.size(); ++i) d += static_cast<double>(a[i]) * b[i];
    return d;
  }

  // The one bucket a single word lands in.
  static int BucketOf(const Embedder& e, const std::string& word) {
    const std::vector<float> v = Embed(e, word);
    int bucket = -1;
    for (int i = 0; i < static_cast<int>(v.size()); ++i) {
      if (v[i] != 0.0f) {
        EXPECT_EQ(bucket, -1) << word << " lands in two buckets";
        EXPECT_EQ(std::abs(v[i]), 1.0f);
        bucket = i;
      }
    }
    return bucket;
  }
};

TEST_F(HashedTfIdfEmbedderTest, TokenizeLowercasesAlphanumericRunsAndKeepsUtf8) {
  EXPECT_EQ(HashedTfIdfEmbedder::Tokenize("Hello, WORLD! it's the 42nd caf\xc3\xa9..."),
            (std::vector<std::string>{"hello", "world", "it", "s", "the", "42nd", "caf\xc3\xa9"}));
  EXPECT_TRUE(HashedTfIdfEmbedder::Tokenize(" ,;-- !? ").empty());
}

TEST_F(HashedTfIdfEmbedderTest, DeterministicUnitNormAndOfTheRightDimension) {
  const std::unique_ptr<HashedTfIdfEmbedder> a = Make(256, 7);
  const std::unique_ptr<HashedTfIdfEmbedder> b = Make(256, 7);
  const std::string text = "The chef roasted garlic and onions in a hot oven.";
  const std::vector<float> va = Embed(*a, text);
  EXPECT_EQ(a->dim(), 256);
  ASSERT_EQ(va.size(), 256u);
  EXPECT_EQ(va, Embed(*a, text));
  EXPECT_EQ(va, Embed(*b, text));
  EXPECT_NEAR(std::sqrt(Dot(va, va)), 1.0, 1e-6);
  // Another seed hashes the words elsewhere.
  EXPECT_NE(va, Embed(*Make(256, 8), text));
}

// Scenario: the same bag of words in another order, case and punctuation embeds identically.
TEST_F(HashedTfIdfEmbedderTest, SameWordsGiveIdenticalVectors) {
  const std::unique_ptr<HashedTfIdfEmbedder> e = Make();
  EXPECT_EQ(Embed(*e, "the striker scored a goal"), Embed(*e, "A GOAL, the striker... scored!"));
}

TEST_F(HashedTfIdfEmbedderTest, TextsSharingWordsAreCloserThanUnrelatedOnes) {
  const std::unique_ptr<HashedTfIdfEmbedder> e = Make();
  const std::vector<float> cook1 = Embed(*e, "chop the garlic and onions for the sauce");
  const std::vector<float> cook2 = Embed(*e, "fry garlic and onions, then add the tomato sauce");
  const std::vector<float> ball = Embed(*e, "our striker scored twice in the cup final");
  EXPECT_GT(Dot(cook1, cook2), 0.4);
  EXPECT_GT(Dot(cook1, cook2), Dot(cook1, ball) + 0.3);
}

// Scenario: nothing to embed -> the zero vector, not NaN.
TEST_F(HashedTfIdfEmbedderTest, TextWithoutWordsStaysZero) {
  const std::unique_ptr<HashedTfIdfEmbedder> e = Make(64);
  EXPECT_EQ(Embed(*e, ""), std::vector<float>(64, 0.0f));
  EXPECT_EQ(Embed(*e, " ... !!! "), std::vector<float>(64, 0.0f));
}

// Scenario: "goal goal striker": tf 2 weighs 1 + ln 2 against 1 (idf 1 before any Fit).
TEST_F(HashedTfIdfEmbedderTest, TermFrequencyIsSublinear) {
  const std::unique_ptr<HashedTfIdfEmbedder> e = Make();
  const int goal = BucketOf(*e, "goal");
  const int striker = BucketOf(*e, "striker");
  ASSERT_NE(goal, striker);
  const std::vector<float> v = Embed(*e, "goal goal striker");
  EXPECT_NEAR(std::abs(v[goal]) / std::abs(v[striker]), 1.0 + std::log(2.0), 1e-6);
}

// Scenario: a corpus of 3 documents, "the" in all of them, "onion" in one:
// idf(the) = ln(4/4) + 1 = 1, idf(onion) = ln(4/2) + 1, unseen words ln(4) + 1, so in
// "the onion" the ubiquitous word weighs 1 / (1 + ln 2) of the rare one.
TEST_F(HashedTfIdfEmbedderTest, IdfDownWeightsAWordInEveryDocument) {
  const std::unique_ptr<HashedTfIdfEmbedder> e = Make();
  EXPECT_EQ(e->Idf("the"), 1.0);
  const int the = BucketOf(*e, "the");
  const int onion = BucketOf(*e, "onion");
  ASSERT_NE(the, onion);
  const std::vector<float> before = Embed(*e, "the onion");
  EXPECT_EQ(std::abs(before[the]), std::abs(before[onion]));

  const std::vector<std::string> corpus = {"the onion soup", "the match", "The stars, the moon"};
  e->Fit(corpus);
  EXPECT_EQ(e->Idf("the"), 1.0);
  EXPECT_DOUBLE_EQ(e->Idf("onion"), std::log(2.0) + 1.0);
  EXPECT_DOUBLE_EQ(e->Idf("comet"), std::log(4.0) + 1.0);
  const std::vector<float> after = Embed(*e, "the onion");
  EXPECT_NEAR(std::abs(after[the]) / std::abs(after[onion]), 1.0 / (1.0 + std::log(2.0)), 1e-6);
  EXPECT_NEAR(std::sqrt(Dot(after, after)), 1.0, 1e-6);

  // An empty corpus restores idf = 1.
  e->Fit({});
  EXPECT_EQ(e->Idf("onion"), 1.0);
  EXPECT_EQ(Embed(*e, "the onion"), before);
}

TEST_F(HashedTfIdfEmbedderTest, UsableThroughTheInterface) {
  std::unique_ptr<Embedder> e = Make(32);
  absl::StatusOr<std::vector<float>> v = e->Embed("hello");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(static_cast<int>(v->size()), e->dim());
}

TEST_F(HashedTfIdfEmbedderTest, DimBelowOneIsInvalidArgument) {
  absl::StatusOr<std::unique_ptr<HashedTfIdfEmbedder>> e = HashedTfIdfEmbedder::Create({.dim = 0});
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(e.status().message(), "hashed_tfidf: dim must be >= 1, got 0");
}

}  // namespace
}  // namespace recall::cache::episodic
