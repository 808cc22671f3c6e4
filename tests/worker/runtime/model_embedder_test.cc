// ModelEmbedder on stories260K: unit-norm, deterministic embeddings of the model's width;
// the mean-pooled hidden state does not depend on how the text is chunked (so the capture
// sums every token once); a text with no tokens past the BOS is the zero vector; bad options
// are refused by name; and texts on the same topic are closer than texts on different ones,
// enough for the episodes of cache/episodic to follow the topics.
#include "worker/runtime/episodic/model_embedder.h"

#include <cmath>

#include "cache/episodic/episodes.h"
#include "gtest/gtest.h"
#include "tests/common/stories260k.h"
#include "worker/model/loader.h"

namespace recall::runtime {
namespace {

class ModelEmbedderTest : public recall::testing::Stories260KTest {
 protected:
  void SetUp() override {
    Stories260KTest::SetUp();
    if (model_ == nullptr) return;  // skipped or failed
    backend_ = kernels::CreateCpuBackend({1});
  }

  std::unique_ptr<runtime::episodic::ModelEmbedder> Make(
      runtime::episodic::ModelEmbedderOptions o = {}) {
    auto e = runtime::episodic::ModelEmbedder::Create(*model_, *backend_, *tok_, o);
    EXPECT_TRUE(e.ok()) << e.status();
    return e.ok() ? std::move(*e) : nullptr;
  }

  std::unique_ptr<kernels::Backend> backend_;
};

TEST_F(ModelEmbedderTest, UnitNormDeterministicOfTheModelWidthAtTheMiddleLayer) {
  auto e = Make();
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(e->dim(), model_->config.dim);
  EXPECT_EQ(e->layer(), model_->config.n_layers / 2);
  auto a = e->Embed("Lily went to the park with her red ball.");
  auto b = e->Embed("Lily went to the park with her red ball.");
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->size(), static_cast<size_t>(model_->config.dim));
  EXPECT_EQ(*a, *b);
  double norm = 0;
  for (float v : *a) norm += static_cast<double>(v) * v;
  EXPECT_NEAR(norm, 1.0, 1e-5);
}

TEST_F(ModelEmbedderTest, ChunkingDoesNotChangeTheEmbedding) {
  const std::string text =
      "Once upon a time there was a little dog named Max. Max liked to run in the sun.";
  runtime::episodic::ModelEmbedderOptions one;
  one.chunk = 1;
  runtime::episodic::ModelEmbedderOptions some;
  some.chunk = 5;
  auto whole = Make()->Embed(text);
  auto by_one = Make(one)->Embed(text);
  auto by_five = Make(some)->Embed(text);
  ASSERT_TRUE(whole.ok() && by_one.ok() && by_five.ok());
  for (size_t i = 0; i < whole->size(); ++i) {
    EXPECT_NEAR((*by_one)[i], (*whole)[i], 1e-5) << i;
    EXPECT_NEAR((*by_five)[i], (*whole)[i], 1e-5) << i;
  }
  // Another layer gives another embedding.
  runtime::episodic::ModelEmbedderOptions first;
  first.layer = 0;
  auto layer0 = Make(first)->Embed(text);
  ASSERT_TRUE(layer0.ok());
  EXPECT_LT(cache::episodic::CosineSimilarity(*layer0, *whole), 0.999);
}

TEST_F(ModelEmbedderTest, EmptyTextIsTheZeroVector) {
  auto e = Make();
  auto z = e->Embed("");
  ASSERT_TRUE(z.ok()) << z.status();
  for (float v : *z) EXPECT_EQ(v, 0.0f);
}

TEST_F(ModelEmbedderTest, BadOptionsAreRefusedByName) {
  runtime::episodic::ModelEmbedderOptions o;
  o.layer = model_->config.n_layers;
  auto e = runtime::episodic::ModelEmbedder::Create(*model_, *backend_, *tok_, o);
  EXPECT_EQ(e.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("embedder layer"), std::string::npos) << e.status();
  o = {};
  o.max_tokens = model_->config.max_seq_len;
  e = runtime::episodic::ModelEmbedder::Create(*model_, *backend_, *tok_, o);
  EXPECT_NE(e.status().message().find("embedder max_tokens"), std::string::npos) << e.status();
}

TEST_F(ModelEmbedderTest, SameTopicTextsAreCloserAndClusterTogether) {
  const std::vector<std::string> windows = {
      "The cat sat on the mat. The cat was soft and liked milk.",
      "Tom and Sam played ball in the park. They kicked the ball high.",
      "The cat drank her milk and slept on the mat all day.",
      "Sam threw the ball to Tom. Tom ran fast to catch the ball.",
      "The little cat purred on the warm mat after her milk.",
      "The boys played with the big ball in the green park.",
  };
  auto e = Make();
  std::vector<std::vector<float>> emb;
  for (const std::string& w : windows) {
    auto v = e->Embed(w);
    ASSERT_TRUE(v.ok()) << v.status();
    emb.push_back(*v);
  }
  using cache::episodic::CosineSimilarity;
  EXPECT_GT(CosineSimilarity(emb[0], emb[2]), CosineSimilarity(emb[0], emb[1]));
  EXPECT_GT(CosineSimilarity(emb[1], emb[3]), CosineSimilarity(emb[1], emb[2]));
  cache::episodic::KMeansOptions k;
  k.k = 2;
  auto episodes = cache::episodic::BuildEpisodes(emb, k, 8);
  ASSERT_TRUE(episodes.ok()) << episodes.status();
  ASSERT_EQ(episodes->size(), 2u);
  std::vector<std::vector<int>> members = {(*episodes)[0].windows, (*episodes)[1].windows};
  std::sort(members.begin(), members.end());
  EXPECT_EQ(members, (std::vector<std::vector<int>>{{0, 2, 4}, {1, 3, 5}}));
  auto q = e->Embed("Where did the cat sleep after her milk?");
  ASSERT_TRUE(q.ok());
  const int routed = cache::episodic::RouteToEpisode(*q, *episodes);
  ASSERT_GE(routed, 0);
  EXPECT_EQ((*episodes)[routed].windows.front(), 0);
}

}  // namespace
}  // namespace recall::runtime
