// LayerSensitivity on a random-weight model and on stories260K: deterministic; layer 0's keys
// do not depend on context (sigma_0 = 1); a mask that hides nothing gives 1 in every layer
// (the masked pass keeps true positions and the overlap's own K/V); deeper layers see the
// mask; bad options are refused by name; the profile it feeds loads as layer budgets.
#include "worker/offline/sensitivity.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <numeric>

#include "cache/eviction/budget.h"
#include "cache/eviction/sensitivity_profile.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"
#include "tests/common/tiny_model.h"
#include "worker/model/loader.h"
#include "worker/model/random_model.h"
#include "worker/tokenizer/tokenizer.h"

namespace recall::offline {
namespace {

model::ModelConfig TinyConfig() { return testing::TinyModelConfig(3, 256); }

std::vector<int32_t> Tokens(int n) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[i] = (i * 31 + i * i * 7 + 5) % 97;
  return t;
}

SensitivityOptions Small() { return {.block = 32, .sinks = 4, .window = 10, .chunk = 16}; }

class SensitivityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto m = model::MakeRandomModel(TinyConfig(), kernels::DType::kF32, 11);
    ASSERT_TRUE(m.ok()) << m.status();
    model_ = std::move(*m);
    backend_ = kernels::CreateCpuBackend({1});
  }

  std::vector<double> Sigma(int n, const SensitivityOptions& o) {
    absl::StatusOr<std::vector<double>> s = LayerSensitivity(*model_, *backend_, Tokens(n), o);
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? *s : std::vector<double>{};
  }

  std::string Error(int n, const SensitivityOptions& o) {
    absl::StatusOr<std::vector<double>> s = LayerSensitivity(*model_, *backend_, Tokens(n), o);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(s.status().message());
  }

  std::unique_ptr<model::Model> model_;
  std::unique_ptr<kernels::Backend> backend_;
};

TEST_F(SensitivityTest, DeterministicLayerZeroIsOneDeeperLayersSeeTheMask) {
  const std::vector<double> a = Sigma(200, Small());
  const std::vector<double> b = Sigma(200, Small());
  ASSERT_EQ(a.size(), 3u);
  EXPECT_EQ(a, b);
  EXPECT_NEAR(a[0], 1.0, 1e-5);
  for (int l = 1; l < 3; ++l) {
    EXPECT_GT(a[l], -1.0) << "layer " << l;
    EXPECT_LT(a[l], 1.0 - 1e-4) << "layer " << l;
  }
}

// Scenario: sinks = block / 2 and two blocks: block 1 sees tokens [0, 16) as sinks and
// [16, 32) as the overlap, i.e. everything the full pass sees, so every layer gives 1. A
// shift of the positions or overlap K/V not kept from block 0 would break this.
TEST_F(SensitivityTest, MaskHidingNothingGivesOneInEveryLayer) {
  SensitivityOptions o = Small();
  o.sinks = 16;
  for (double s : Sigma(64, o)) EXPECT_NEAR(s, 1.0, 1e-5);
  // One sink fewer hides token 15 from block 1: the deeper layers move.
  o.sinks = 15;
  const std::vector<double> hidden = Sigma(64, o);
  EXPECT_NEAR(hidden[0], 1.0, 1e-5);
  EXPECT_LT(hidden[2], 1.0 - 1e-6);
}

TEST_F(SensitivityTest, ChunkSizeChangesNothingBeyondRounding) {
  const std::vector<double> a = Sigma(150, Small());
  SensitivityOptions o = Small();
  o.chunk = 7;
  const std::vector<double> b = Sigma(150, o);
  ASSERT_EQ(a.size(), b.size());
  for (size_t l = 0; l < a.size(); ++l) EXPECT_NEAR(a[l], b[l], 1e-5) << "layer " << l;
}

TEST_F(SensitivityTest, BadOptionsAreRefusedByName) {
  SensitivityOptions o = Small();
  o.block = 1;
  EXPECT_NE(Error(100, o).find("block"), std::string::npos);
  o = Small();
  o.sinks = -1;
  EXPECT_NE(Error(100, o).find("sinks"), std::string::npos);
  o.sinks = 32;
  EXPECT_NE(Error(100, o).find("sinks"), std::string::npos);
  o = Small();
  o.window = 0;
  EXPECT_NE(Error(100, o).find("window"), std::string::npos);
  o = Small();
  o.chunk = 0;
  EXPECT_NE(Error(100, o).find("chunk"), std::string::npos);
  EXPECT_EQ(Error(32, Small()),
            "block: 32 must be below the token count 32 (only tokens past block 0 "
            "are compared)");
  EXPECT_NE(Error(257, Small()).find("context length 256"), std::string::npos);
}

TEST_F(SensitivityTest, ProfileOfTheSigmaLoadsAsLayerBudgets) {
  cache::eviction::SensitivityProfile p;
  p.model = "random";
  p.sigma = Sigma(200, Small());
  p.block = 32;
  p.sinks = 4;
  p.window = 10;
  p.tokens = 200;
  const std::string path =
      ::testing::TempDir() + "/recall_sensitivity_test_" + std::to_string(::getpid()) + ".json";
  std::ofstream(path) << cache::eviction::SensitivityProfileJson(p);
  cache::eviction::BudgetOptions o;
  o.kind = cache::eviction::BudgetOptions::Kind::kProfile;
  o.profile_path = path;
  o.budget = 64;
  absl::StatusOr<cache::eviction::BudgetAllocator> a =
      cache::eviction::BudgetAllocator::Create(o, 3);
  std::remove(path.c_str());
  ASSERT_TRUE(a.ok()) << a.status();
  int32_t b[3];
  a->Allocate(0, b);
  EXPECT_EQ(b[0] + b[1] + b[2], 3 * 64);
  EXPECT_EQ(b[0], 16);  // layer 0 (sigma 1) is the least sensitive: the floor C / 4
}

TEST(SensitivityStoriesTest, Stories260KLayerZeroIsOneAndRunsAreIdentical) {
  constexpr char kModel[] = "models/stories260K/stories260K.bin";
  constexpr char kTokenizer[] = "models/stories260K/tok512.bin";
  RECALL_REQUIRE_SHARED_FILE(kModel);
  auto m = model::LoadModel(recall::testing::SharedPath(kModel));
  ASSERT_TRUE(m.ok()) << m.status();
  auto tok = model::LoadTokenizer(recall::testing::SharedPath(kTokenizer), 512);
  ASSERT_TRUE(tok.ok()) << tok.status();
  std::vector<int32_t> tokens = (*tok)->Encode(
      "Once upon a time, there was a little girl named Lily. She loved to play outside in "
      "the park with her big red ball. One day she saw a small dog under a tree. The dog "
      "was sad because it was lost. Lily gave the dog some water and a hug. Then she helped "
      "the dog find its home, and the dog's family was very happy. They said thank you, and "
      "Lily smiled all the way home.",
      /*add_bos=*/true);
  ASSERT_GT(tokens.size(), 64u);
  auto backend = kernels::CreateCpuBackend({1});
  const SensitivityOptions o{.block = 32, .sinks = 4, .window = 10, .chunk = 64};
  auto a = LayerSensitivity(**m, *backend, tokens, o);
  auto b = LayerSensitivity(**m, *backend, tokens, o);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
  ASSERT_EQ(a->size(), 5u);
  EXPECT_EQ(*a, *b);
  EXPECT_NEAR((*a)[0], 1.0, 1e-5);
  for (size_t l = 1; l < a->size(); ++l) {
    EXPECT_GT((*a)[l], -1.0) << "layer " << l;
    EXPECT_LE((*a)[l], 1.0 + 1e-9) << "layer " << l;
  }
}

}  // namespace
}  // namespace recall::offline
