#include "cache/eviction/budget.h"

#include <cmath>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace recall::cache::eviction {
namespace {

std::vector<int32_t> Allocate(const BudgetOptions& o, int layers, int64_t seq_len) {
  absl::StatusOr<BudgetAllocator> a = BudgetAllocator::Create(o, layers);
  EXPECT_TRUE(a.ok()) << a.status();
  if (!a.ok()) return {};
  std::vector<int32_t> out(static_cast<size_t>(layers));
  a->Allocate(seq_len, out.data());
  return out;
}

int64_t Sum(const std::vector<int32_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t{0}); }

TEST(BudgetAllocatorTest, UniformGivesEveryLayerC) {
  BudgetOptions o;
  o.budget = 100;
  EXPECT_EQ(Allocate(o, 4, 5000), (std::vector<int32_t>{100, 100, 100, 100}));
}

// Scenario: 25% of a 401-token sequence = ceil(100.25) = 101 tokens per layer; the budget
// follows the sequence as it grows.
TEST(BudgetAllocatorTest, FractionOfSequenceLengthIsRecomputedPerCall) {
  BudgetOptions o;
  o.unit = BudgetOptions::Unit::kFraction;
  o.budget = 0.25;
  absl::StatusOr<BudgetAllocator> a = BudgetAllocator::Create(o, 2);
  ASSERT_TRUE(a.ok());
  int32_t out[2];
  a->Allocate(401, out);
  EXPECT_EQ(out[0], 101);
  EXPECT_EQ(out[1], 101);
  a->Allocate(800, out);
  EXPECT_EQ(out[0], 200);
  // Never below `reserved`.
  o.reserved = 32;
  EXPECT_EQ(Allocate(o, 2, 10), (std::vector<int32_t>{32, 32}));
}

// Scenario: PyramidKV, L = 4, C = 100, beta = 20, reserved (window) 32. Weights
// 1.95, 1.3167, 0.6833, 0.05 split L * (C - 32) = 272 tokens:
//   exact 132.6, 89.53, 46.47, 3.4 -> floors 132, 89, 46, 3 (= 270), the 2 left go to the
//   largest remainders (layers 0, 1) -> 133, 90, 46, 3; plus 32 each.
TEST(BudgetAllocatorTest, PyramidDecreasesLinearlyAndSumsToLTimesC) {
  BudgetOptions o;
  o.kind = BudgetOptions::Kind::kPyramid;
  o.budget = 100;
  o.reserved = 32;
  EXPECT_EQ(Allocate(o, 4, 0), (std::vector<int32_t>{165, 122, 78, 35}));
  // Without reserve, over many shapes: sum exactly L * C, non-increasing, each layer within
  // one token of the real-valued PyramidKV line.
  o.reserved = 0;
  for (int layers : {1, 2, 3, 7, 32, 80}) {
    for (int c : {1, 20, 100, 1023, 4096}) {
      o.budget = c;
      const std::vector<int32_t> b = Allocate(o, layers, 0);
      ASSERT_EQ(Sum(b), static_cast<int64_t>(layers) * c) << layers << " layers, C " << c;
      const double lo = 1.0 / 20, hi = 2.0 - lo;
      for (int l = 0; l < layers; ++l) {
        const double w = layers == 1 ? 1.0 : hi - l * (hi - lo) / (layers - 1);
        EXPECT_LT(std::abs(b[l] - c * w), 1.0 + 1e-9) << "layer " << l;
        if (l > 0) {
          EXPECT_LE(b[l], b[l - 1]) << "layer " << l;
        }
      }
    }
  }
}

TEST(BudgetAllocatorTest, BadOptionsNameTheField) {
  BudgetOptions o;
  o.budget = 0;
  EXPECT_NE(BudgetAllocator::Create(o, 4).status().message().find("budget in tokens"),
            absl::string_view::npos);
  o.unit = BudgetOptions::Unit::kFraction;
  o.budget = 1.5;
  EXPECT_NE(BudgetAllocator::Create(o, 4).status().message().find("fraction"),
            absl::string_view::npos);
  o = BudgetOptions{};
  o.kind = BudgetOptions::Kind::kPyramid;
  o.beta = 1.0;
  EXPECT_NE(BudgetAllocator::Create(o, 4).status().message().find("beta"),
            absl::string_view::npos);
  EXPECT_EQ(BudgetAllocator::Create(BudgetOptions{}, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(BudgetProfileTest, ParsesOneWeightPerLineWithCommentsAndBlankLines) {
  absl::StatusOr<std::vector<double>> w =
      ParseBudgetProfile("# sensitivity profile\n1.5\n\n  2 # layer 1\n0.25\n", "p.txt", 3);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(*w, (std::vector<double>{1.5, 2.0, 0.25}));
}

TEST(BudgetProfileTest, ErrorsNameTheSourceLineAndProblem) {
  EXPECT_EQ(ParseBudgetProfile("1\n# c\nabc\n", "p.txt", 3).status().message(),
            "p.txt:3: 'abc' is not a number");
  EXPECT_EQ(ParseBudgetProfile("1\n2x\n", "p.txt", 2).status().message(),
            "p.txt:2: '2x' is not a number");
  EXPECT_EQ(ParseBudgetProfile("1\n0\n", "p.txt", 2).status().message(),
            "p.txt:2: layer weight 0 must be positive");
  EXPECT_EQ(ParseBudgetProfile("-1\n", "p.txt", 1).status().message(),
            "p.txt:1: layer weight -1 must be positive");
  EXPECT_EQ(ParseBudgetProfile("1\n2\n", "p.txt", 3).status().message(),
            "p.txt: expected 3 layer weights, found 2");
  EXPECT_EQ(ParseBudgetProfile("1\n2\n", "p.txt", 3).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Scenario: a profile file with weights 1 and 3 for 2 layers, C = 100: the 200 tokens split
// 50 / 150. A missing file is NotFound naming the path.
TEST(BudgetProfileTest, ProfileFileSplitsBudgetByWeight) {
  const std::string path = ::testing::TempDir() + "/recall_budget_profile.txt";
  {
    std::ofstream f(path);
    f << "1\n3\n";
  }
  BudgetOptions o;
  o.kind = BudgetOptions::Kind::kProfile;
  o.profile_path = path;
  o.budget = 100;
  EXPECT_EQ(Allocate(o, 2, 0), (std::vector<int32_t>{50, 150}));
  absl::StatusOr<BudgetAllocator> bad = BudgetAllocator::Create(o, 3);
  EXPECT_EQ(bad.status().message(), path + ": expected 3 layer weights, found 2");
  std::remove(path.c_str());
  absl::StatusOr<BudgetAllocator> missing = BudgetAllocator::Create(o, 2);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find(path), absl::string_view::npos);
}

}  // namespace
}  // namespace recall::cache::eviction
