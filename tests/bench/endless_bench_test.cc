// recall_endless_bench on a tiny setting (one text of 700 tokens, lazy at C = 64, W = 16): a
// real run of the benchmark binary on stories260K, whose figures are finite, whose cache was
// re-positioned past the context, and which prints its ratio line.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "cache/eviction/eviction_policy.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/common/test_util.h"

namespace recall::bench {
namespace {

TEST(EndlessBenchTest, ATinyRunPrintsFiniteFiguresAndTheRatioLine) {
  RECALL_REQUIRE_SHARED_FILE("models/stories260K/stories260K.bin");
  const std::string dir = testing::MakeTempDir("endless_bench");
  const std::string cmd =
      std::string(RECALL_ENDLESS_BENCH_BINARY) + " --model " +
      testing::SharedPath("models/stories260K/stories260K.bin") + " --tokenizer " +
      testing::SharedPath("models/stories260K/tok512.bin") +
      " --texts 1 --tokens 700 --policies lazy --budgets 64 --window 16 --slot-baseline 0" +
      " --out-json " + dir + "/e.json --out-txt " + dir + "/e.txt > " + dir + "/stdout.txt 2>&1";
  const int rc = std::system(cmd.c_str());
  const std::string stdout_text = testing::ReadFileOrEmpty(dir + "/stdout.txt");
  ASSERT_EQ(rc, 0) << cmd << "\n" << stdout_text;

  // The ratio line: lazy peaks at C + W = 80 slots, five whole blocks of 16 in every layer,
  // and its state (ts and mri of 5 layers x 4 KV heads) beside them, so the baseline's M is
  // 80 tokens and what the state holds in tokens of 5 x 4 x 8 x (K, V) x 4 bytes.
  const int64_t token_bytes = 5 * 4 * 8 * 2 * 4;
  const int64_t state_most = 5 * 4 *
                             cache::eviction::HeadStateBytesBound(
                                 cache::eviction::kTsArray | cache::eviction::kMriArray, 80);
  const size_t at = stdout_text.find("\nratio lazy C=64 ");
  ASSERT_NE(at, std::string::npos) << stdout_text;
  const std::string line = stdout_text.substr(at + 1, stdout_text.find('\n', at + 1) - at - 1);
  int c = 0, m = 0;
  double ppl_past = 0, base_past = 0, ratio_past = 0, ppl_all = 0, base_all = 0, ratio_all = 0;
  ASSERT_EQ(
      std::sscanf(line.c_str(),
                  "ratio lazy C=%d M=%d: perplexity past the context %lf / baseline %lf = "
                  "%lf; all positions %lf / %lf = %lf",
                  &c, &m, &ppl_past, &base_past, &ratio_past, &ppl_all, &base_all, &ratio_all),
      8)
      << line;
  EXPECT_EQ(c, 64);
  EXPECT_GT(m, 80) << "the state is memory the baseline gets too";
  EXPECT_LE(m, 80 + state_most / token_bytes);
  for (double ppl : {ppl_past, base_past, ppl_all, base_all}) {
    EXPECT_TRUE(std::isfinite(ppl)) << line;
    EXPECT_GT(ppl, 1.0) << line;
  }
  EXPECT_TRUE(std::isfinite(ratio_past) && ratio_past > 0) << line;
  EXPECT_TRUE(std::isfinite(ratio_all) && ratio_all > 0) << line;
  EXPECT_NEAR(ratio_past, ppl_past / base_past, 1e-3) << line;

  // The JSON holds the same run: finite, past the context, re-positioned.
  std::ifstream in(dir + "/e.json");
  const nlohmann::json json = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(json.is_discarded());
  EXPECT_EQ(json["settings"]["text_tokens"], 700);
  ASSERT_EQ(json["results"].size(), 1u);
  const nlohmann::json& r = json["results"][0];
  for (const char* key : {"ppl_past_context", "ppl_all", "baseline_ppl_past_context",
                          "baseline_ppl_all", "ratio_past_context", "ratio_all"}) {
    ASSERT_TRUE(r[key].is_number()) << key << ": " << r[key];  // NaN would be null
    EXPECT_TRUE(std::isfinite(r[key].get<double>())) << key;
  }
  EXPECT_EQ(r["peak_tokens"], m);
  EXPECT_EQ(r["peak_slots"], 80);
  EXPECT_GE(r["compactions"].get<int>(), 1) << "700 tokens pass the context of 512";
  // The held tokens' mean age past the context lies within the text; two stretches of targets.
  EXPECT_GT(r["mean_age_past_context"].get<double>(), 0);
  EXPECT_LT(r["mean_age_past_context"].get<double>(), 700);
  EXPECT_EQ(r["ppl_by_segment"].size(), 2u);
  EXPECT_TRUE(json["full_cache"]["ppl"].is_number());

  // --out-txt is what was printed.
  EXPECT_NE(testing::ReadFileOrEmpty(dir + "/e.txt").find(line), std::string::npos);
}

// The outputs are checked before the run (a full one takes about 20 minutes), not after it.
TEST(EndlessBenchTest, BadOutputPathsAreRefusedBeforeTheRun) {
  const std::string dir = testing::MakeTempDir("endless_bench_outputs");
  const std::string bin = RECALL_ENDLESS_BENCH_BINARY;
  testing::Exit e = testing::RunToExit(bin + " --texts 1 --out-json " + dir + "/nodir/e.json", 60);
  EXPECT_EQ(e.code, 2) << e.output;
  EXPECT_NE(e.output.find("--out-json: cannot write " + dir + "/nodir/e.json"), std::string::npos)
      << e.output;
  e = testing::RunToExit(
      bin + " --texts 1 --out-json " + dir + "/e.json --out-txt " + dir + "/nodir/e.txt", 60);
  EXPECT_EQ(e.code, 2) << e.output;
  EXPECT_NE(e.output.find("--out-txt: cannot write"), std::string::npos) << e.output;
  e = testing::RunToExit(bin + " --texts 1 --out-json " + dir, 60);
  EXPECT_EQ(e.code, 2) << e.output;
  EXPECT_NE(e.output.find("is a directory"), std::string::npos) << e.output;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace recall::bench
