// Layer sensitivity profiles (JSON written by `recall calibrate`): parsing and its error
// messages, EpiCache's weights, and BudgetAllocator reading a JSON profile (exact sum, the
// C / 4 floor, fewer tokens for less sensitive layers) beside the text format.
#include "cache/eviction/sensitivity_profile.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "cache/eviction/budget.h"
#include "gtest/gtest.h"

namespace recall::cache::eviction {
namespace {

std::string Json(const std::string& fields) {
  return R"({"format": "recall-layer-sensitivity", "version": 1, )" + fields + "}";
}

std::string Message(absl::string_view text, int layers) {
  return std::string(ParseSensitivityProfile(text, "p.json", layers).status().message());
}

class JsonProfileTest : public ::testing::Test {
 protected:
  void TearDown() override { std::remove(path_.c_str()); }

  // Writes `sigma` as a profile and returns the allocator's budgets for L = sigma.size().
  std::vector<int32_t> Budgets(const std::vector<double>& sigma, int c, int reserved = 0,
                               double alpha = 1.2) {
    Write(sigma);
    BudgetOptions o;
    o.kind = BudgetOptions::Kind::kProfile;
    o.profile_path = path_;
    o.budget = c;
    o.reserved = reserved;
    o.sensitivity_alpha = alpha;
    absl::StatusOr<BudgetAllocator> a = BudgetAllocator::Create(o, static_cast<int>(sigma.size()));
    EXPECT_TRUE(a.ok()) << a.status();
    if (!a.ok()) return {};
    std::vector<int32_t> out(sigma.size());
    a->Allocate(0, out.data());
    return out;
  }

  void Write(const std::vector<double>& sigma) {
    SensitivityProfile p;
    p.model = "m.bin";
    p.sigma = sigma;
    std::ofstream(path_) << "\n  " << SensitivityProfileJson(p);  // leading space: still JSON
  }

  // One file per test: ctest runs the tests of this fixture in parallel processes.
  const std::string path_ = ::testing::TempDir() + "/recall_sensitivity_" +
                            ::testing::UnitTest::GetInstance()->current_test_info()->name() + "_" +
                            std::to_string(::getpid()) + ".json";
};

TEST(SensitivityProfileTest, WrittenProfileParsesBackExactly) {
  SensitivityProfile p;
  p.model = "models/x.bin";
  p.sigma = {1.0, 0.9137281746, 0.1 + 0.2, -0.25};
  p.block = 128;
  p.sinks = 16;
  p.window = 100;
  p.tokens = 512;
  const std::string text = SensitivityProfileJson(p);
  EXPECT_NE(text.find("\"format\": \"recall-layer-sensitivity\""), std::string::npos);
  EXPECT_NE(text.find("\"n_layers\": 4"), std::string::npos);
  EXPECT_NE(text.find("\"block\": 128"), std::string::npos);
  EXPECT_EQ(text.back(), '\n');
  absl::StatusOr<std::vector<double>> sigma = ParseSensitivityProfile(text, "p.json", 4);
  ASSERT_TRUE(sigma.ok()) << sigma.status();
  EXPECT_EQ(*sigma, p.sigma);
}

TEST(SensitivityProfileTest, ErrorsNameTheFileAndTheProblem) {
  EXPECT_EQ(Message("1\n2\n", 2).rfind("p.json: not JSON: ", 0), 0u) << Message("1\n2\n", 2);
  EXPECT_EQ(Message("{\"format\": ", 2).rfind("p.json: not JSON: ", 0), 0u);
  EXPECT_EQ(Message("[1, 2]", 2), "p.json: not a JSON object");
  EXPECT_EQ(Message(R"({"version": 1, "n_layers": 2, "sigma": [1, 2]})", 2),
            "p.json: \"format\" is missing, expected \"recall-layer-sensitivity\"");
  EXPECT_EQ(Message(R"({"format": "other", "version": 1})", 2),
            "p.json: \"format\" is \"other\", expected \"recall-layer-sensitivity\"");
  EXPECT_EQ(Message(R"({"format": "recall-layer-sensitivity", "version": 2})", 2),
            "p.json: \"version\" is 2, expected 1");
  EXPECT_EQ(Message(Json(R"("sigma": [1, 2])"), 2),
            "p.json: \"n_layers\" is missing or not an integer");
  EXPECT_EQ(Message(Json(R"("n_layers": 3, "sigma": [1, 2, 3])"), 2),
            "p.json: expected 2 layers, profile has 3");
  EXPECT_EQ(Message(Json(R"("n_layers": 2)"), 2), "p.json: \"sigma\" is missing or not an array");
  EXPECT_EQ(Message(Json(R"("n_layers": 2, "sigma": 0.5)"), 2),
            "p.json: \"sigma\" is missing or not an array");
  EXPECT_EQ(Message(Json(R"("n_layers": 2, "sigma": [0.5, "a"])"), 2),
            "p.json: sigma[1] = \"a\" is not a number");
  EXPECT_EQ(Message(Json(R"("n_layers": 2, "sigma": [null, 1])"), 2),
            "p.json: sigma[0] = null is not a number");
  // JSON has no infinities; an overflowing number is refused by the parser.
  EXPECT_EQ(
      Message(Json(R"("n_layers": 2, "sigma": [1e999, 1])"), 2).rfind("p.json: not JSON: ", 0), 0u);
  EXPECT_EQ(Message(Json(R"("n_layers": 2, "sigma": [0.5])"), 2),
            "p.json: \"sigma\" has 1 values, expected 2 (one per layer)");
  EXPECT_EQ(ParseSensitivityProfile("[]", "p.json", 2).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Scenario: sigma 0.5, 1, 0.75: min-max gives 0, 1, 0.5, so weights (1 - hat)^alpha.
TEST(SensitivityProfileTest, WeightsAreOneMinusMinMaxNormalisedSigmaToTheAlpha) {
  EXPECT_EQ(SensitivityWeights({0.5, 1.0, 0.75}, 1.0), (std::vector<double>{1.0, 0.0, 0.5}));
  EXPECT_EQ(SensitivityWeights({0.5, 1.0, 0.75}, 2.0), (std::vector<double>{1.0, 0.0, 0.25}));
  const std::vector<double> w = SensitivityWeights({0.5, 1.0, 0.75}, 1.2);
  EXPECT_DOUBLE_EQ(w[2], std::pow(0.5, 1.2));
  // All equal (or one layer): uniform.
  EXPECT_EQ(SensitivityWeights({0.9, 0.9, 0.9}, 1.2), (std::vector<double>{1.0, 1.0, 1.0}));
  EXPECT_EQ(SensitivityWeights({0.3}, 1.2), (std::vector<double>{1.0}));
}

// Scenario: L = 4, C = 100, alpha 1.2. The floor raises reserved to 25 and the weights
// 1, 0.0737..., 0.5637..., 0 split the other 4 * 75 = 300 tokens: exact 183.2, 13.52,
// 103.28, 0 -> floors 183, 13, 103, 0 (299); the one left goes to layer 1 (largest
// remainder). The least sensitive layer (sigma 0.99) gets exactly the floor.
TEST_F(JsonProfileTest, BudgetsFollowSensitivityWithAQuarterFloorAndExactSum) {
  EXPECT_EQ(Budgets({0.2, 0.9, 0.5, 0.99}, 100), (std::vector<int32_t>{208, 39, 128, 25}));
  // A larger reserve (the policy's window) stays: 4 * (100 - 32) = 272 split by weight.
  const std::vector<int32_t> r = Budgets({0.2, 0.9, 0.5, 0.99}, 100, 32);
  EXPECT_EQ(std::accumulate(r.begin(), r.end(), 0), 400);
  EXPECT_EQ(r[3], 32);
}

TEST_F(JsonProfileTest, OverManyShapesSumIsExactFloorHoldsAndOrderFollowsSigma) {
  for (int layers : {1, 2, 5, 32}) {
    std::vector<double> sigma(static_cast<size_t>(layers));
    for (int l = 0; l < layers; ++l) sigma[l] = 0.5 + 0.5 * std::sin(1.7 * l + 0.3);
    for (int c : {1, 3, 64, 1000}) {
      for (double alpha : {0.5, 1.2, 3.0}) {
        const std::vector<int32_t> b = Budgets(sigma, c, 0, alpha);
        ASSERT_EQ(b.size(), sigma.size());
        EXPECT_EQ(std::accumulate(b.begin(), b.end(), int64_t{0}), int64_t{layers} * c)
            << layers << " layers, C " << c;
        for (int l = 0; l < layers; ++l) {
          EXPECT_GE(b[l], (c + 3) / 4) << "layer " << l;
          for (int m = 0; m < layers; ++m) {
            // Strictly more sensitive (lower sigma) never gets fewer tokens (rounding: 1).
            if (sigma[l] < sigma[m]) {
              EXPECT_GE(b[l] + 1, b[m]) << l << " vs " << m;
            }
          }
        }
      }
    }
  }
  // All layers equally sensitive: uniform.
  EXPECT_EQ(Budgets({0.7, 0.7, 0.7}, 10), (std::vector<int32_t>{10, 10, 10}));
}

TEST_F(JsonProfileTest, ProfileErrorsAndAlphaOutOfRangeAreInvalidArgument) {
  Write({0.1, 0.2, 0.3});
  BudgetOptions o;
  o.kind = BudgetOptions::Kind::kProfile;
  o.profile_path = path_;
  absl::StatusOr<BudgetAllocator> bad = BudgetAllocator::Create(o, 2);
  EXPECT_EQ(bad.status().message(), path_ + ": expected 2 layers, profile has 3");
  for (double alpha : {0.49, 3.01, std::nan("")}) {
    o.sensitivity_alpha = alpha;
    absl::StatusOr<BudgetAllocator> a = BudgetAllocator::Create(o, 3);
    EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(a.status().message().find("sensitivity_alpha"), absl::string_view::npos);
  }
}

// The text format is still read as weights, with no floor: weights 1 and 3 split 50 / 150.
TEST_F(JsonProfileTest, TextProfileIsStillOneWeightPerLine) {
  std::ofstream(path_) << "# weights\n1\n3\n";
  BudgetOptions o;
  o.kind = BudgetOptions::Kind::kProfile;
  o.profile_path = path_;
  o.budget = 100;
  absl::StatusOr<BudgetAllocator> a = BudgetAllocator::Create(o, 2);
  ASSERT_TRUE(a.ok()) << a.status();
  int32_t out[2];
  a->Allocate(0, out);
  EXPECT_EQ(out[0], 50);
  EXPECT_EQ(out[1], 150);
}

}  // namespace
}  // namespace recall::cache::eviction
