// `recall calibrate` on stories260K: writes a profile that loads as layer budgets and prints
// one sigma per layer; a missing --out or a bad flag is bad usage (exit 2); an unwritable
// --out is a runtime failure naming the file.
#include "cli/calibrate_layers_command.h"

#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "cache/eviction/budget.h"
#include "cache/eviction/sensitivity_profile.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"

namespace recall::cli {
namespace {

constexpr char kModel[] = "models/stories260K/stories260K.bin";
constexpr char kTokenizer[] = "models/stories260K/tok512.bin";

std::vector<std::string> Flags(const std::string& out) {
  std::vector<std::string> f = {"--model",     recall::testing::SharedPath(kModel),
                                "--tokenizer", recall::testing::SharedPath(kTokenizer),
                                "--threads",   "1"};
  if (!out.empty()) {
    f.push_back("--out");
    f.push_back(out);
  }
  return f;
}

TEST(CalibrateLayersCommandTest, WritesAProfileThatLoadsAsLayerBudgets) {
  RECALL_REQUIRE_SHARED_FILE(kModel);
  const std::string out = recall::testing::MakeTempDir("calibrate") + "/profile.json";
  ::testing::internal::CaptureStdout();
  const int rc = RunCalibrateLayers(Flags(out));
  const std::string printed = ::testing::internal::GetCapturedStdout();
  ASSERT_EQ(rc, 0) << printed;
  // 512 tokens of the built-in text: block 128, sinks 16; five layers printed.
  EXPECT_NE(printed.find("tokens=512 block=128 sinks=16 window=100"), std::string::npos) << printed;
  EXPECT_NE(printed.find("layer 0: sigma=1.000000"), std::string::npos) << printed;
  EXPECT_NE(printed.find("layer 4: sigma="), std::string::npos) << printed;
  EXPECT_NE(printed.find("wrote " + out), std::string::npos) << printed;
  const std::string text = recall::testing::ReadFileOrEmpty(out);
  EXPECT_NE(text.find("\"tokens\": 512"), std::string::npos) << text;
  EXPECT_TRUE(cache::eviction::ParseSensitivityProfile(text, out, 5).ok());
  cache::eviction::BudgetOptions o;
  o.kind = cache::eviction::BudgetOptions::Kind::kProfile;
  o.profile_path = out;
  o.budget = 64;
  absl::StatusOr<cache::eviction::BudgetAllocator> a =
      cache::eviction::BudgetAllocator::Create(o, 5);
  ASSERT_TRUE(a.ok()) << a.status();
  int32_t b[5];
  a->Allocate(0, b);
  EXPECT_EQ(b[0] + b[1] + b[2] + b[3] + b[4], 5 * 64);
  std::remove(out.c_str());
}

TEST(CalibrateLayersCommandTest, MissingOutOrBadFlagIsUsageAndUnwritableOutFails) {
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(RunCalibrateLayers(Flags("")), 2);
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("--out is required"), std::string::npos) << err;
  EXPECT_NE(err.find("(recall calibrate --help lists the flags)"), std::string::npos) << err;
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(RunCalibrateLayers({"--model", "m.bin", "--out", "x.json", "--bogus", "1"}), 2);
  ::testing::internal::GetCapturedStderr();

  RECALL_REQUIRE_SHARED_FILE(kModel);
  // An --out that cannot be written is refused at start, before the run (it was found once
  // the profile had been computed); so is a directory.
  for (const std::string& out :
       {std::string("/nonexistent-dir/profile.json"), ::testing::TempDir()}) {
    std::vector<std::string> f = Flags(out);
    f.insert(f.end(), {"--block", "256"});
    ::testing::internal::CaptureStdout();
    ::testing::internal::CaptureStderr();
    EXPECT_EQ(RunCalibrateLayers(f), 2);
    err = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(::testing::internal::GetCapturedStdout(), "") << "nothing computed";
    EXPECT_NE(err.find("recall calibrate: --out: "), std::string::npos) << err;
    EXPECT_NE(
        err.find(out.find("nonexistent") != std::string::npos ? "no directory /nonexistent-dir"
                                                              : "is a directory"),
        std::string::npos)
        << err;
  }
  // An empty --text says so, not that the default block is too long for it.
  const std::string empty = ::testing::TempDir() + "/empty.txt";
  std::ofstream(empty).close();
  std::vector<std::string> f = Flags(::testing::TempDir() + "/unused.json");
  f.insert(f.end(), {"--text", empty});
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(RunCalibrateLayers(f), 2);
  err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("--text: " + empty + " holds 1 token(s)"), std::string::npos) << err;
  const std::string binary = ::testing::TempDir() + "/binary.txt";
  std::ofstream(binary) << "text \xff\xfe bytes";
  f = Flags(::testing::TempDir() + "/unused.json");
  f.insert(f.end(), {"--text", binary});
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(RunCalibrateLayers(f), 2);
  err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("--text: " + binary + " is not UTF-8 text"), std::string::npos) << err;
  // --block at the token count leaves nothing to compare: bad usage.
  f = Flags(::testing::TempDir() + "/unused.json");
  f.insert(f.end(), {"--block", "512"});
  ::testing::internal::CaptureStderr();
  EXPECT_EQ(RunCalibrateLayers(f), 2);
  err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("--block: 512 must be below the token count 512"), std::string::npos) << err;
}

}  // namespace
}  // namespace recall::cli
