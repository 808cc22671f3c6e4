// Golden: stories260K greedy output equals what llama2.c's run.c prints, through the
// llama2.c loader and through the Hugging Face loader after tools/convert_llama2c_to_hf.py.
#include <cstdlib>
#include <filesystem>

#include "cache/block_pool.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "tests/common/test_util.h"
#include "worker/model/loader.h"
#include "worker/offline/generator.h"
#include "worker/runtime/forward.h"
#include "worker/tokenizer/tokenizer.h"

namespace recall::offline {
namespace {

constexpr char kModel[] = "models/stories260K/stories260K.bin";
constexpr char kTokenizer[] = "models/stories260K/tok512.bin";

struct GoldenCase {
  const char* name;
  const char* prompt;
  int steps;  // run.c -n: forward passes, prompt included
  const char* golden_file;
};

std::string RunGreedy(const model::Model& model, const model::Tokenizer& tok, const GoldenCase& gc,
                      int prefill_chunk) {
  std::unique_ptr<kernels::Backend> backend = kernels::CreateCpuBackend();
  const model::ModelConfig& c = model.config;
  auto pool = cache::BlockPool::Create({c.n_layers, c.n_kv_heads, c.head_dim, 16},
                                       c.n_layers * ((c.max_seq_len + 15) / 16));
  EXPECT_TRUE(pool.ok()) << pool.status();
  runtime::ForwardPass forward(model, *backend, {256});
  const std::vector<int32_t> prompt = tok.Encode(gc.prompt, /*add_bos=*/true);
  GenerateOptions options;
  options.sampling.temperature = 0.0f;
  // run.c runs `steps` forward passes and prints the token each one yields: the prompt's
  // tokens after BOS, then its own.
  options.max_tokens = gc.steps - static_cast<int>(prompt.size()) + 1;
  options.stop_token_ids = {1};  // run.c stops at BOS
  options.prefill_chunk = prefill_chunk;
  auto result = Generate(forward, **pool, tok, prompt, options);
  EXPECT_TRUE(result.ok()) << result.status();
  if (!result.ok()) return "";
  EXPECT_EQ((*pool)->free_blocks(), (*pool)->num_blocks());
  std::vector<int32_t> all = prompt;
  all.insert(all.end(), result->tokens.begin(), result->tokens.end());
  return tok.Decode(all);
}

std::string Golden(const GoldenCase& gc) {
  std::string text = testing::ReadFileOrEmpty(testing::SharedPath(gc.golden_file));
  while (!text.empty() && text.back() == '\n') text.pop_back();
  return text;
}

class GoldenTest : public ::testing::TestWithParam<GoldenCase> {};

TEST_P(GoldenTest, Llama2cLoaderMatchesRunC) {
  RECALL_REQUIRE_SHARED_FILE(kModel);
  auto model = model::LoadLlama2c(testing::SharedPath(kModel));
  ASSERT_TRUE(model.ok()) << model.status();
  auto tok = model::LoadTokenizer(testing::SharedPath(kTokenizer), 512);
  ASSERT_TRUE(tok.ok()) << tok.status();
  const GoldenCase& gc = GetParam();
  EXPECT_EQ(RunGreedy(**model, **tok, gc, 256), Golden(gc));
  // Token-by-token prompt processing (run.c's way) gives the same text.
  EXPECT_EQ(RunGreedy(**model, **tok, gc, 1), Golden(gc));
}

TEST_P(GoldenTest, HuggingFaceLoaderAfterConversionMatchesRunC) {
  RECALL_REQUIRE_SHARED_FILE(kModel);
  const std::string dir = testing::MakeTempDir("golden_hf");
  const std::string cmd = "python3 " + testing::SourcePath("tools/convert_llama2c_to_hf.py") + " " +
                          testing::SharedPath(kModel) + " " + dir + " > /dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  auto model = model::LoadHuggingFace(dir);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->config.rope_style, kernels::RopeStyle::kHalfSplit);
  auto tok = model::LoadTokenizer(testing::SharedPath(kTokenizer), 512);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ(RunGreedy(**model, **tok, GetParam(), 256), Golden(GetParam()));
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Stories260K, GoldenTest,
    ::testing::Values(GoldenCase{"OnceUponATime", "Once upon a time", 256,
                                 "models/stories260K/golden_greedy_once_upon_a_time_n256.txt"},
                      GoldenCase{"NoPrompt", "", 512,
                                 "models/stories260K/golden_greedy_noprompt_n512.txt"}),
    [](const ::testing::TestParamInfo<GoldenCase>& info) { return info.param.name; });

}  // namespace
}  // namespace recall::offline
