// `recall generate` with each --kv-dtype on stories260K, greedy: with f32 the texts equal the
// golden outputs of llama2.c's run.c byte for byte (the fp32 path stays exact); every other
// type runs and its agreement with the golden text is printed. Its --top-k is held to the
// vocabulary, as a server holds it.
#include <string>

#include "gtest/gtest.h"
#include "tests/common/test_util.h"

namespace recall {
namespace {

constexpr char kModel[] = "models/stories260K/stories260K.bin";
constexpr char kTokenizer[] = "models/stories260K/tok512.bin";

struct CliRun {
  int exit_code = -1;
  std::string out, err;
};

CliRun Generate(const std::string& dir, const std::string& prompt, int max_tokens,
                const std::string& kv_dtype, const std::string& more_flags = "") {
  const std::string out = dir + "/out.txt", err = dir + "/err.txt";
  const std::string cmd =
      std::string("'") + RECALL_CLI_BINARY + "' generate --model '" + testing::SharedPath(kModel) +
      "' --tokenizer '" + testing::SharedPath(kTokenizer) + "' --prompt '" + prompt +
      "' --temperature 0 --echo --threads 1 --max-tokens " + std::to_string(max_tokens) +
      " --kv-dtype " + kv_dtype + " " + more_flags + " > '" + out + "' 2> '" + err + "'";
  CliRun r;
  const int status = std::system(cmd.c_str());
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = testing::ReadFileOrEmpty(out);
  r.err = testing::ReadFileOrEmpty(err);
  return r;
}

size_t CommonPrefix(const std::string& a, const std::string& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return i;
}

TEST(GenerateKvDtypeTest, F32ReproducesTheGoldenTextsAndEveryTypeRuns) {
  RECALL_REQUIRE_SHARED_FILE(kModel);
  const std::string dir = testing::MakeTempDir("generate_kv_dtype");
  // run.c's -n counts forward passes, the prompt (after BOS) included.
  const struct {
    const char* prompt;
    int max_tokens;
    const char* golden;
  } cases[] = {
      {"Once upon a time", 252, "models/stories260K/golden_greedy_once_upon_a_time_n256.txt"},
      {"", 511, "models/stories260K/golden_greedy_noprompt_n512.txt"}};
  for (const auto& c : cases) {
    const std::string golden = testing::ReadFileOrEmpty(testing::SharedPath(c.golden));
    ASSERT_FALSE(golden.empty()) << c.golden;
    for (const char* t : {"f32", "bf16", "f16", "int8"}) {
      SCOPED_TRACE(std::string(t) + " \"" + c.prompt + "\"");
      const CliRun r = Generate(dir, c.prompt, c.max_tokens, t);
      ASSERT_EQ(r.exit_code, 0) << r.err;
      if (std::string(t) == "f32") {
        EXPECT_EQ(r.out, golden);
      }
      std::printf(
          "--kv-dtype %-4s \"%s\": %zu of the golden text's %zu bytes before the first "
          "difference\n",
          t, c.prompt, CommonPrefix(r.out, golden), golden.size());
    }
  }
  // --stats names the types that ran.
  const CliRun stats = Generate(dir, "Once", 4, "int8", "--stats --weight-dtype int8");
  ASSERT_EQ(stats.exit_code, 0) << stats.err;
  EXPECT_NE(stats.err.find("engine: cpu; int8 weights; int8 KV pool"), std::string::npos)
      << stats.err;
  // A type that does not exist is a usage error naming the flag.
  const CliRun bad = Generate(dir, "Once", 4, "fp8");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("--kv-dtype"), std::string::npos) << bad.err;
  // So is a prompt that is not UTF-8, as a server refuses such a message (it was generated
  // from the bytes' fallback tokens).
  const CliRun bytes = Generate(dir, "Once \xff upon", 4, "f32");
  EXPECT_EQ(bytes.exit_code, 2) << bytes.err;
  EXPECT_NE(bytes.err.find("--prompt: is not valid UTF-8"), std::string::npos) << bytes.err;
}

// A --top-k above the vocabulary is refused, as a server refuses it (it was taken as "off").
TEST(GenerateKvDtypeTest, ATopKAboveTheVocabularyIsRefusedAsByAServer) {
  RECALL_REQUIRE_SHARED_FILE(kModel);
  const std::string dir = testing::MakeTempDir("generate_top_k");
  const CliRun over = Generate(dir, "Once", 4, "f32", "--top-k 513");
  EXPECT_EQ(over.exit_code, 2) << over.err;
  EXPECT_NE(over.err.find("--top-k: must be in [0, 512] (0: off; the vocabulary's size), got 513"),
            std::string::npos)
      << over.err;
  const CliRun at = Generate(dir, "Once", 4, "f32", "--top-k 512");
  EXPECT_EQ(at.exit_code, 0) << at.err;
  // An empty --stop names the flag (it said "stop strings must not be empty").
  const CliRun stop = Generate(dir, "Once", 4, "f32", "--stop ''");
  EXPECT_EQ(stop.exit_code, 2) << stop.err;
  EXPECT_NE(stop.err.find("--stop: empty; give the text to stop at"), std::string::npos)
      << stop.err;
}

}  // namespace
}  // namespace recall
