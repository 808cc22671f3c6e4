// `recall calibrate-window` on stories260K: prints the MRI percentile as the suggested window
// and, from caches of the policy at each alpha decoding beside the full cache, one figure per
// alpha and the suggested alpha (one with the lowest mean KL), written with --out as the file
// `recall serve --calibration` takes; a bad alpha list or a policy
// that does not evict is bad usage (exit 2) naming the flag.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
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
double MeanKl(const std::string& printed, const std::string& alpha) {
  const size_t at = printed.find("  alpha=" + alpha + " ");
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

TEST(CalibrateWindowCommandTest, ABadAlphaListOrAPolicyThatKeepsEverythingIsUsage) {
  RECALL_REQUIRE_SHARED_FILE(kModel);
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(RunCalibrateWindow(Flags({"--alphas", "1e-3,2"})), 2);
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("--alphas: '2' is not a number in (0, 1)"), std::string::npos) << err;
  ::testing::internal::CaptureStderr();
  ::testing::internal::CaptureStdout();
  EXPECT_EQ(RunCalibrateWindow(Flags({"--policy", "full"})), 2);
  ::testing::internal::GetCapturedStdout();
  err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("--policy: full does not evict"), std::string::npos) << err;
  // --alphas none: the window only.
  ::testing::internal::CaptureStdout();
  EXPECT_EQ(RunCalibrateWindow(Flags({"--alphas", "none"})), 0);
  const std::string printed = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(printed.find("suggested --window "), std::string::npos) << printed;
  EXPECT_EQ(printed.find("alpha search"), std::string::npos) << printed;
}

}  // namespace
}  // namespace recall::cli
