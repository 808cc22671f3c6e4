// The benchmark programs' command lines, run as a user would run them: an unknown flag, a flag
// without its value and a value out of range exit 2 with a message naming the flag, before
// any work; --dir (journal) and --tmp (weight quality) work in a directory of their own
// inside the one given and leave what it holds; a --model or --config given explicitly that
// does not exist is an error, not a SKIP. Each case stops at its flags or runs a tiny size.
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/common/test_util.h"

namespace recall::bench {
namespace {

struct Case {
  std::string binary;
  std::string args;
  std::string message;  // a part of what it must print
};

void ExpectExit(const Case& c, int code) {
  const testing::Exit e = testing::RunToExit(c.binary + " " + c.args, 60);
  EXPECT_EQ(e.code, code) << c.binary << " " << c.args << "\n" << e.output;
  EXPECT_NE(e.output.find(c.message), std::string::npos)
      << c.binary << " " << c.args << ": expected \"" << c.message << "\" in\n"
      << e.output;
}

const std::vector<std::pair<std::string, std::string>>& Binaries() {
  // Each binary with one of its flags that takes a value.
  static const std::vector<std::pair<std::string, std::string>> b = {
      {RECALL_SPEED_BENCH_BINARY, "--steps"},
      {RECALL_SERVING_BENCH_BINARY, "--sessions"},
      {RECALL_COORDINATOR_BENCH_BINARY, "--sessions"},
      {RECALL_JOURNAL_BENCH_BINARY, "--tokens"},
      {RECALL_REPLAY_BENCH_BINARY, "--turns"},
      {RECALL_TP_EVICTION_BENCH_BINARY, "--tp"},
      {RECALL_KV_DTYPE_BENCH_BINARY, "--steps"},
      {RECALL_WEIGHT_QUALITY_BENCH_BINARY, "--texts"},
  };
  return b;
}

TEST(BenchFlagsTest, AnUnknownFlagOrAFlagWithoutItsValueExits2) {
  for (const auto& [binary, flag] : Binaries()) {
    ExpectExit({binary, "--bogus", "unknown flag --bogus"}, 2);
    ExpectExit({binary, flag, flag + " needs a value"}, 2);
  }
}

TEST(BenchFlagsTest, HelpExits0AndListsTheFlags) {
  for (const auto& [binary, flag] : Binaries()) {
    ExpectExit({binary, "--help", "  " + flag + " "}, 0);
    ExpectExit({binary, "-h", "-h, --help"}, 0);
  }
}

TEST(BenchFlagsTest, AValueOutOfRangeExits2NamingTheFlag) {
  const std::vector<Case> cases = {
      {RECALL_SPEED_BENCH_BINARY, "--prompt 0 --policies 0 --dtypes bf16", "--prompt: must be in"},
      {RECALL_SPEED_BENCH_BINARY, "--prompt -4", "--prompt: must be in"},
      {RECALL_SPEED_BENCH_BINARY, "--steps abc", "--steps: \"abc\" is not an integer"},
      {RECALL_SPEED_BENCH_BINARY, "--budget-gib -1", "--budget-gib: must be in"},
      {RECALL_SPEED_BENCH_BINARY, "--dtypes bf16,xyz", "--dtypes: \"xyz\""},
      {RECALL_SPEED_BENCH_BINARY, "--policies 2", "--policies: must be in [0, 1]"},
      {RECALL_SERVING_BENCH_BINARY, "--sessions 0", "--sessions: must be in"},
      {RECALL_SERVING_BENCH_BINARY, "--max-tokens 0", "--max-tokens: must be in"},
      {RECALL_SERVING_BENCH_BINARY, "--throughput 2", "--throughput: must be in [0, 1]"},
      {RECALL_COORDINATOR_BENCH_BINARY, "--long-turns 50", "--long-turns: must be 0"},
      {RECALL_COORDINATOR_BENCH_BINARY, "--sessions abc", "--sessions: \"abc\""},
      {RECALL_JOURNAL_BENCH_BINARY, "--tokens 50", "--tokens:"},
      {RECALL_REPLAY_BENCH_BINARY, "--turns 1", "--turns: must be in [2,"},
      {RECALL_REPLAY_BENCH_BINARY, "--rounds 0", "--rounds: must be in [1,"},
      {RECALL_TP_EVICTION_BENCH_BINARY, "--tp 0", "--tp: must be in [1,"},
      {RECALL_TP_EVICTION_BENCH_BINARY, "--steps 0", "--steps: must be in [1,"},
      {RECALL_TP_EVICTION_BENCH_BINARY, "--dtype xyz", "--dtype: \"xyz\" is not one of bf16, f32"},
      {RECALL_TP_EVICTION_BENCH_BINARY, "--device tpu", "--device: \"tpu\" is not one of"},
      {RECALL_KV_DTYPE_BENCH_BINARY, "--steps 0", "--steps: must be in [1,"},
      {RECALL_KV_DTYPE_BENCH_BINARY, "--session-tokens 16", "--session-tokens: must be in [65,"},
      {RECALL_KV_DTYPE_BENCH_BINARY, "--pool-bytes 64Q", "--pool-bytes: \"64Q\" is not a size"},
      {RECALL_WEIGHT_QUALITY_BENCH_BINARY, "--texts 0", "--texts: must be in [1,"},
  };
  for (const Case& c : cases) ExpectExit(c, 2);
}

TEST(BenchFlagsTest, KvDtypePoolBytesTakesASize) {
  RECALL_REQUIRE_SHARED_FILE("models/stories260K/tok512.bin");
  ExpectExit({RECALL_KV_DTYPE_BENCH_BINARY, "--pool-bytes 4M --session-tokens 128 --skip-speed",
              "in one 4 MiB pool"},
             0);
}

// What a directory held before the benchmark ran, and must hold after it.
void FillDir(const std::string& dir) {
  std::filesystem::create_directories(dir + "/sub");
  std::ofstream(dir + "/keep.txt") << "important\n";
  std::ofstream(dir + "/sub/also.txt") << "also\n";
}
void ExpectFilled(const std::string& dir) {
  EXPECT_EQ(testing::ReadFileOrEmpty(dir + "/keep.txt"), "important\n");
  EXPECT_EQ(testing::ReadFileOrEmpty(dir + "/sub/also.txt"), "also\n");
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    names.push_back(e.path().filename().string());
  }
  EXPECT_EQ(names.size(), 2u) << "the benchmark's own directory is removed at the end";
}

TEST(BenchFlagsTest, JournalDirLeavesWhatTheDirectoryHolds) {
  const std::string dir = testing::MakeTempDir("journal_bench_dir");
  FillDir(dir);
  ExpectExit({RECALL_JOURNAL_BENCH_BINARY, "--tokens 100 --dir " + dir, "replace whole"}, 0);
  ExpectFilled(dir);
  // A --dir under a regular file, or missing: an error naming the flag, not a crash.
  ExpectExit({RECALL_JOURNAL_BENCH_BINARY, "--tokens 100 --dir " + dir + "/keep.txt/x", "--dir: "},
             2);
  ExpectExit({RECALL_JOURNAL_BENCH_BINARY, "--tokens 100 --dir " + dir + "/keep.txt",
              "is not a directory"},
             2);
  ExpectFilled(dir);
  std::filesystem::remove_all(dir);
}

TEST(BenchFlagsTest, WeightQualityTmpLeavesWhatTheDirectoryHolds) {
  RECALL_REQUIRE_SHARED_FILE("models/stories260K/stories260K.bin");
  const std::string dir = testing::MakeTempDir("weight_bench_tmp");
  FillDir(dir);
  ExpectExit({RECALL_WEIGHT_QUALITY_BENCH_BINARY, "--texts 1 --tmp " + dir, "int8 per block"}, 0);
  ExpectFilled(dir);
  ExpectExit(
      {RECALL_WEIGHT_QUALITY_BENCH_BINARY, "--texts 1 --tmp " + dir + "/keep.txt/x", "--tmp: "}, 2);
  ExpectFilled(dir);
  std::filesystem::remove_all(dir);
}

TEST(BenchFlagsTest, AMissingFileGivenExplicitlyIsAnErrorNotASkip) {
  ExpectExit({RECALL_SPEED_BENCH_BINARY, "--config /nonexistent/config.json",
              "--config: /nonexistent/config.json"},
             2);
  ExpectExit({RECALL_TP_EVICTION_BENCH_BINARY, "--config /nonexistent/config.json",
              "/nonexistent/config.json"},
             2);
  ExpectExit({RECALL_WEIGHT_QUALITY_BENCH_BINARY, "--model /nonexistent/model.bin",
              "--model: /nonexistent/model.bin: no such file"},
             2);
  ExpectExit({RECALL_WEIGHT_QUALITY_BENCH_BINARY, "--tokenizer /nonexistent/tok.bin",
              "--tokenizer: /nonexistent/tok.bin: no such file"},
             2);
}

}  // namespace
}  // namespace recall::bench
