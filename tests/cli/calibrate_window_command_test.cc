// `recall calibrate-window` on stories260K: prints the MRI percentile as the suggested window
// and, from caches of the policy at each alpha decoding beside the full cache, one figure per
// alpha and the suggested alpha (one with the lowest mean KL), written with --out as the file
// `recall serve --calibration` takes; a bad alpha list or a policy
// that does not evict is bad usage (exit 2) naming the flag.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "cli/calibrate_command.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"
#include "worker/serving/calibration.h"

namespace recall::cli {
namespace {

constexpr char kModel[] = "models/stories260K/stories260K.bin";
constexpr char kTokenizer[] = "models/stories260K/tok512.bin";

std::vector<std::string> Flags(std::vector<std::string> extra) {
  std::vector<std::string> f = {"--model",     recall::testing::SharedPath(kModel),
                                "--tokenizer", recall::testing::SharedPath(kTokenizer),
                                "--threads",   "1",
                                "--texts",     "1",
                                "--tokens",    "200"};
  f.insert(f.end(), extra.begin(), extra.end());
  return f;
}

// The mean KL printed for `alpha` ("  alpha=A mean_kl=K ..."), or -1.
double MeanKl(const std::string& printed, const std::string& alpha,
              const std::string& name = "alpha") {
  const size_t at = printed.find("  " + name + "=" + alpha + " ");
  if (at == std::string::npos) return -1;
  const size_t kl = printed.find("mean_kl=", at);
  double v = -1;
  if (kl == std::string::npos ||
      !absl::SimpleAtod(printed.substr(kl + 8, printed.find(' ', kl) - kl - 8), &v)) {
    return -1;
  }
  return v;
}

TEST(CalibrateWindowCommandTest, SuggestsAWindowAndTheAlphaWithTheLowestKl) {
  RECALL_REQUIRE_SHARED_FILE(kModel);
  const std::string out = recall::testing::MakeTempDir("calibrate_window") + "/cal.json";
  ::testing::internal::CaptureStdout();
  const int rc = RunCalibrateWindow(
      Flags({"--alphas", "1e-4,3e-2", "--budget-frac", "0.3", "--window", "24", "--out", out}));
  const std::string printed = ::testing::internal::GetCapturedStdout();
  ASSERT_EQ(rc, 0) << printed;
  EXPECT_NE(printed.find("suggested --window "), std::string::npos) << printed;
  EXPECT_NE(printed.find("alpha search: lazy+ at --budget-frac 0.3 (60 tokens), W=24"),
            std::string::npos)
      << printed;
  const double low = MeanKl(printed, "0.0001"), high = MeanKl(printed, "0.03");
  ASSERT_GT(low, 0) << printed;
  ASSERT_GT(high, 0) << printed;
  const std::string suggested = low <= high ? "0.0001" : "0.03";
  EXPECT_NE(printed.find("suggested --alpha " + suggested + "\n"), std::string::npos) << printed;
  // The file recall serve --calibration takes: the suggested alpha, the window it was
  // measured with.
  absl::StatusOr<serving::EvictionCalibration> c = serving::ReadEvictionCalibration(out);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->window, 24);
  EXPECT_EQ(c->alpha, low <= high ? 1e-4 : 3e-2);
  EXPECT_EQ(c->policy, "lazy+");
  EXPECT_EQ(c->budget_fraction, 0.3);
}

// lazy+'s relative thresholds are tried beside the absolute alphas, every cache with the given
// value protection and meta score; the file carries the winner and those settings.
TEST(CalibrateWindowCommandTest, TriesRelativeThresholdsAndWritesWhatItRanWith) {
  RECALL_REQUIRE_SHARED_FILE(kModel);
  const std::string out = recall::testing::MakeTempDir("calibrate_uniform") + "/cal.json";
  ::testing::internal::CaptureStdout();
  const int rc = RunCalibrateWindow(
      Flags({"--alphas", "1e-4", "--alphas-uniform", "0.5,3", "--budget-frac", "0.3",
             "--value-protection", "0.1", "--meta-score", "caote", "--out", out}));
  const std::string printed = ::testing::internal::GetCapturedStdout();
  ASSERT_EQ(rc, 0) << printed;
  EXPECT_NE(printed.find("(every cache with value protection 0.1, meta score caote, layer "
                         "budgets uniform)"),
            std::string::npos)
      << printed;
  const double absolute = MeanKl(printed, "0.0001");
  const double half = MeanKl(printed, "0.5", "alpha_uniform");
  const double three = MeanKl(printed, "3", "alpha_uniform");
  ASSERT_GT(absolute, 0) << printed;
  ASSERT_GT(half, 0) << printed;
  ASSERT_GT(three, 0) << printed;
  EXPECT_NE(printed.find("suggested --alpha 0.0001\n"), std::string::npos) << printed;
  double winner = 0;
  if (std::min(half, three) < absolute) winner = half <= three ? 0.5 : 3;
  if (winner > 0) {
    EXPECT_NE(printed.find(absl::StrCat("suggested --alpha-uniform ", winner, "\n")),
              std::string::npos)
        << printed;
  }
  absl::StatusOr<serving::EvictionCalibration> c = serving::ReadEvictionCalibration(out);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->alpha, 1e-4);
  EXPECT_EQ(c->alpha_uniform, winner);
  EXPECT_EQ(c->value_protection, 0.1);
  EXPECT_EQ(c->meta_score, "caote");
  // Relative thresholds are lazy+'s.
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(RunCalibrateWindow(Flags({"--policy", "lazy", "--alphas-uniform", "3"})), 2);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("--alphas-uniform: lazy+'s relative thresholds"), std::string::npos) << err;
}

TEST(CalibrateWindowCommandTest, ABadAlphaListOrAPolicyThatKeepsEverythingIsUsage) {
  RECALL_REQUIRE_SHARED_FILE(kModel);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(RunCalibrateWindow(Flags({"--alphas", "1e-3,2"})), 2);
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("--alphas: '2' is not a number in (0, 1)"), std::string::npos) << err;
  ::testing::internal::CaptureStderr();  // an empty item (it was skipped)
  EXPECT_EQ(RunCalibrateWindow(Flags({"--alphas", "1e-3,,2e-3"})), 2);
  err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("--alphas: '' is not a number in (0, 1)"), std::string::npos) << err;
  ::testing::internal::CaptureStderr();
  ::testing::internal::CaptureStdout();
  EXPECT_EQ(RunCalibrateWindow(Flags({"--policy", "full"})), 2);
  ::testing::internal::GetCapturedStdout();
  err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("--policy: full is not an evicting policy a calibration applies to"),
            std::string::npos)
      << err;
  // Episodic: recall serve's --calibration takes no such file (it wrote one after the run).
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(RunCalibrateWindow(Flags({"--policy", "episodic", "--out", "/tmp/never.json"})), 2);
  err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("--policy: episodic is not an evicting policy a calibration applies to "
                     "(streaming, h2o"),
            std::string::npos)
      << err;
  // A policy that takes no alpha: no search by default (every alpha kept the same cache, and
  // the first of the tie was suggested), and an --alphas list or --out is refused naming it.
  ::testing::internal::CaptureStdout();
  EXPECT_EQ(RunCalibrateWindow(Flags({"--policy", "h2o"})), 0);
  std::string h2o = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(h2o.find("suggested --window "), std::string::npos) << h2o;
  EXPECT_EQ(h2o.find("alpha search"), std::string::npos) << h2o;
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(RunCalibrateWindow(Flags({"--policy", "h2o", "--alphas", "1e-3"})), 2);
  err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("--alphas: --policy h2o takes no alpha (lazy and lazy+ do)"),
            std::string::npos)
      << err;
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(RunCalibrateWindow(Flags({"--policy", "tova", "--out", "/tmp/never.json"})), 2);
  err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("--out: writes the alpha search's result, and --policy tova takes no alpha"),
            std::string::npos)
      << err;
  // --alphas none: the window only.
  ::testing::internal::CaptureStdout();
  EXPECT_EQ(RunCalibrateWindow(Flags({"--alphas", "none"})), 0);
  const std::string printed = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(printed.find("suggested --window "), std::string::npos) << printed;
  EXPECT_EQ(printed.find("alpha search"), std::string::npos) << printed;
  // A budget below what the policy keeps names the two flags it comes from.
  ::testing::internal::CaptureStderr();
  ::testing::internal::CaptureStdout();
  EXPECT_EQ(RunCalibrateWindow(Flags({"--tokens", "128"})), 2);
  ::testing::internal::GetCapturedStdout();
  err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("--budget-frac: 0.2 x --tokens 128 = 26 is below"), std::string::npos) << err;
  EXPECT_NE(err.find("(raise --budget-frac or --tokens)"), std::string::npos) << err;
  // A window no budget of the texts can hold says to lower the window (it said to raise the
  // budget, which no fraction could).
  ::testing::internal::CaptureStderr();
  ::testing::internal::CaptureStdout();
  EXPECT_EQ(RunCalibrateWindow(Flags({"--tokens", "128", "--window", "128"})), 2);
  ::testing::internal::GetCapturedStdout();
  err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("--window: 128 keeps at least as many tokens as the texts have (--tokens "
                     "128): no budget evicts anything; give a window below 128"),
            std::string::npos)
      << err;
  // An --out that cannot be written is refused at start, not after the search.
  ::testing::internal::CaptureStderr();
  ::testing::internal::CaptureStdout();
  EXPECT_EQ(RunCalibrateWindow(Flags({"--out", "/nonexistent-dir/cal.json"})), 2);
  EXPECT_EQ(::testing::internal::GetCapturedStdout(), "") << "nothing computed";
  err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(
      err.find("--out: cannot write /nonexistent-dir/cal.json: no directory /nonexistent-dir"),
      std::string::npos)
      << err;
}

}  // namespace
}  // namespace recall::cli
