// recall_quality_bench on a tiny setting (one text per set; full, streaming and lazy+ at two
// budgets, W and alpha from a calibration file): a real run of the benchmark binary on
// stories260K that ends well, whose FullKV rows agree with FullKV, and whose JSON holds the
// settings it ran with and the equal-peak comparison on both text sets.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "common/files.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/test_util.h"
#include "worker/serving/calibration.h"

namespace recall::bench {
namespace {

TEST(QualityBenchTest, ATinyRunComparesAtEqualPeakOnTwoTextSets) {
  RECALL_REQUIRE_SHARED_FILE("models/stories260K/stories260K.bin");
  const std::string dir = testing::MakeTempDir("quality_bench");
  // The window and alpha come from a calibration file, as for recall serve --calibration.
  ASSERT_TRUE(WriteFileWhole("calibration", dir + "/cal.json",
                             serving::EvictionCalibrationJson({"lazy+", 0.2, 24, 0.02}))
                  .ok());
  const std::string cmd =
      std::string(RECALL_QUALITY_BENCH_BINARY) + " --model " +
      testing::SharedPath("models/stories260K/stories260K.bin") + " --tokenizer " +
      testing::SharedPath("models/stories260K/tok512.bin") +
      " --texts 1 --policies full,streaming,lazy+ --budgets 0.2,0.5 --peaks 0.3,0.9" +
      " --heldout-seed 7 --calibration " + dir + "/cal.json --out-json " + dir +
      "/q.json --out-png " + dir + "/q.png > " + dir + "/stdout.txt 2>&1";
  const int rc = std::system(cmd.c_str());
  const std::string stdout_text = testing::ReadFileOrEmpty(dir + "/stdout.txt");
  ASSERT_EQ(rc, 0) << cmd << "\n" << stdout_text;
  EXPECT_NE(stdout_text.find("At equal peak KV memory, held-out texts of seed 7"),
            std::string::npos)
      << stdout_text;

  std::ifstream in(dir + "/q.json");
  const nlohmann::json json = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(json.is_discarded()) << "q.json is not JSON";
  EXPECT_EQ(json["settings"]["window"], 24);
  EXPECT_EQ(json["settings"]["alpha"], 0.02);
  for (const nlohmann::json& r : json["results"]) {
    if (r["policy"] != "full") continue;
    EXPECT_GT(r["positions_counted"].get<int>(), 0) << r.dump();
    EXPECT_EQ(r["top1_agreement"].get<double>(), 1.0) << r.dump();
  }
  for (const char* key : {"equal_peak", "equal_peak_heldout"}) {
    ASSERT_TRUE(json.contains(key)) << key;
    EXPECT_FALSE(json[key].contains("full")) << key;
    for (const char* policy : {"streaming", "lazy+"}) {
      const nlohmann::json& row = json[key][policy];
      EXPECT_FALSE(row["never_evicts"].get<bool>()) << key << " " << policy;
      ASSERT_EQ(row["sweep"].size(), 2u) << key << " " << policy;
      // 30% lies between the two budgets' peaks (about 20-25% and 50-53%): interpolated,
      // a top-1 agreement in (0, 1]; 90% lies beyond the sweep: no figure.
      const double top1 = row["at"][0]["top1"].get<double>();
      EXPECT_GT(top1, 0.0) << key << " " << policy;
      EXPECT_LE(top1, 1.0) << key << " " << policy;
      EXPECT_TRUE(row["at"][1]["top1"].is_null()) << key << " " << policy;
    }
  }
}

// With two KV types, every (policy, type) is placed at the bytes it holds: a bf16 run at a 20%
// budget holds about 11% of the f32 FullKV's bytes, a peak no f32 run of the sweep reaches.
TEST(QualityBenchTest, KvTypesAreComparedAtTheBytesTheyHold) {
  RECALL_REQUIRE_SHARED_FILE("models/stories260K/stories260K.bin");
  const std::string dir = testing::MakeTempDir("quality_bench_bytes");
  const std::string cmd = std::string(RECALL_QUALITY_BENCH_BINARY) + " --model " +
                          testing::SharedPath("models/stories260K/stories260K.bin") +
                          " --tokenizer " + testing::SharedPath("models/stories260K/tok512.bin") +
                          " --texts 1 --policies full,streaming --budgets 0.2,0.4 --peaks 0.15" +
                          " --heldout-seed 7 --kv-dtypes f32,bf16 --out-json " + dir +
                          "/q.json --out-png " + dir + "/q.png > " + dir + "/stdout.txt 2>&1";
  const int rc = std::system(cmd.c_str());
  const std::string stdout_text = testing::ReadFileOrEmpty(dir + "/stdout.txt");
  ASSERT_EQ(rc, 0) << cmd << "\n" << stdout_text;
  EXPECT_NE(stdout_text.find("every KV type at its bytes"), std::string::npos) << stdout_text;
  EXPECT_NE(stdout_text.find("q_bytes.png"), std::string::npos)
      << "the bytes plot is written (or its absence warned)\n"
      << stdout_text;
  std::ifstream in(dir + "/q.json");
  const nlohmann::json json = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(json.is_discarded()) << "q.json is not JSON";
  for (const char* key : {"equal_bytes", "equal_bytes_heldout"}) {
    ASSERT_TRUE(json.contains(key)) << key;
    const nlohmann::json& f32 = json[key]["streaming f32"];
    const nlohmann::json& bf16 = json[key]["streaming bf16"];
    ASSERT_EQ(f32["sweep"].size(), 2u) << key;
    ASSERT_EQ(bf16["sweep"].size(), 2u) << key;
    // Half the bytes per token: each bf16 point sits at half its f32 twin's peak.
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_NEAR(bf16["sweep"][i]["peak"].get<double>(), f32["sweep"][i]["peak"].get<double>() / 2,
                  0.02)
          << key << " " << i;
    }
    EXPECT_TRUE(f32["at"][0]["top1"].is_null()) << key;
    EXPECT_FALSE(bf16["at"][0]["top1"].is_null()) << key;
  }
}

// The outputs are checked before the run (a full one takes minutes), and a model given
// explicitly that does not exist is an error, not a SKIP.
TEST(QualityBenchTest, BadOutputPathsAndAMissingModelAreRefusedBeforeTheRun) {
  const std::string dir = testing::MakeTempDir("quality_bench_outputs");
  const std::string bin = RECALL_QUALITY_BENCH_BINARY;
  testing::Exit e = testing::RunToExit(bin + " --texts 1 --out-json " + dir + "/nodir/q.json", 60);
  EXPECT_EQ(e.code, 2) << e.output;
  EXPECT_NE(e.output.find("--out-json: cannot write " + dir + "/nodir/q.json"), std::string::npos)
      << e.output;
  e = testing::RunToExit(
      bin + " --texts 1 --out-json " + dir + "/q.json --out-png " + dir + "/nodir/q.png", 60);
  EXPECT_EQ(e.code, 2) << e.output;
  EXPECT_NE(e.output.find("--out-png: cannot write"), std::string::npos) << e.output;
  EXPECT_FALSE(std::filesystem::exists(dir + "/q.json")) << "nothing written before the run";
  e = testing::RunToExit(bin + " --texts 1 --model /nonexistent/model.bin --out-json " + dir +
                             "/q.json --out-png " + dir + "/q.png",
                         60);
  EXPECT_EQ(e.code, 2) << e.output;
  EXPECT_NE(e.output.find("--model: /nonexistent/model.bin: no such file"), std::string::npos)
      << e.output;
  EXPECT_EQ(e.output.find("SKIP"), std::string::npos) << e.output;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace recall::bench
