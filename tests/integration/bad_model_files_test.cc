// Issue 27 reproduced on the real binaries: model and tokenizer files that crashed `recall
// generate` (SIGSEGV / SIGABRT) or let `recall-worker` log "serving" and abort on its first
// turn now make both exit non-zero at start-up with a message naming the file and the field.
// Every process runs under timeout(1), so a worker that serves anyway fails the test.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/common/test_util.h"
#include "tests/worker/model/test_files.h"

extern char** environ;

namespace recall {
namespace {

namespace test = model::test;

constexpr char kStories[] = "models/stories260K/stories260K.bin";
constexpr char kTok512[] = "models/stories260K/tok512.bin";

struct ProcessRun {
  int exit_code = -1;  // timeout(1)'s: the program's, or 128 + signal, 137 when timed out
  std::string out, err;
};

// Runs `binary args...` under `timeout -s KILL 60`, its output in files under `dir`.
ProcessRun RunProcess(const std::string& dir, const std::string& binary,
                      std::vector<std::string> args) {
  args.insert(args.begin(), {"timeout", "-s", "KILL", "60", binary});
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const std::string out = dir + "/stdout.txt", err = dir + "/stderr.txt";
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_addopen(&actions, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ProcessRun r;
  pid_t pid = -1;
  if (posix_spawnp(&pid, "timeout", &actions, nullptr, argv.data(), environ) == 0) {
    int status = 0;
    if (waitpid(pid, &status, 0) == pid && WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  }
  posix_spawn_file_actions_destroy(&actions);
  r.out = testing::ReadFileOrEmpty(out);
  r.err = testing::ReadFileOrEmpty(err);
  return r;
}

class BadModelFilesTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = testing::MakeTempDir("bad_model_files"); }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  ProcessRun Generate(const std::string& model, const std::string& tokenizer) {
    std::vector<std::string> args = {"generate",
                                     "--model",
                                     model,
                                     "--prompt",
                                     "Once upon a time",
                                     "--temperature",
                                     "0",
                                     "--max-tokens",
                                     "8",
                                     "--threads",
                                     "1"};
    if (!tokenizer.empty()) args.insert(args.end(), {"--tokenizer", tokenizer});
    return RunProcess(dir_, RECALL_CLI_BINARY, args);
  }
  ProcessRun Worker(const std::string& model, const std::string& tokenizer) {
    return RunProcess(
        dir_, RECALL_WORKER_BINARY,
        {"--model", model, "--tokenizer", tokenizer, "--listen", "127.0.0.1:0", "--threads", "1"});
  }

  // Both binaries refuse the pair at start-up: a plain non-zero exit (no signal, no
  // timeout), the message on stderr, and the worker never serves.
  void ExpectRefused(const std::string& model, const std::string& tokenizer,
                     const std::string& message) {
    const ProcessRun g = Generate(model, tokenizer);
    EXPECT_TRUE(g.exit_code == 1 || g.exit_code == 2) << g.exit_code << "\n" << g.err;
    EXPECT_NE(g.err.find(message), std::string::npos) << g.err;
    const ProcessRun w = Worker(model, tokenizer);
    EXPECT_TRUE(w.exit_code == 1 || w.exit_code == 2) << w.exit_code << "\n" << w.err;
    EXPECT_NE(w.err.find(message), std::string::npos) << w.err;
    EXPECT_EQ(w.err.find("serving"), std::string::npos) << w.err;
  }

  std::string dir_;
};

TEST_F(BadModelFilesTest, Stories260KWithVocabSize1Or8OrMinus1IsRefusedAtStartUp) {
  RECALL_REQUIRE_SHARED_FILE(kStories);
  const std::string bytes = testing::ReadFileOrEmpty(testing::SharedPath(kStories));
  for (int32_t vocab : {1, 8, -1}) {
    SCOPED_TRACE(vocab);
    std::string bad = bytes;
    std::memcpy(bad.data() + 5 * 4, &vocab, 4);
    const std::string path = dir_ + "/stories_vocab" + std::to_string(vocab) + ".bin";
    test::WriteFile(path, bad);
    ExpectRefused(path, testing::SharedPath(kTok512), path + ": llama2.c checkpoint is ");
    ExpectRefused(path, testing::SharedPath(kTok512),
                  "header field vocab_size = " + std::to_string(vocab) +
                      " is likely wrong: vocab_size = 512 (tied)");
  }
}

TEST_F(BadModelFilesTest, SyntheticCheckpointWithBadDimensionsIsRefusedAtStartUp) {
  const std::vector<int32_t> good = {8, 12, 2, 2, 1, 300, 64};
  const std::string model = dir_ + "/model.bin", tok = dir_ + "/tok.bin";
  test::WriteFile(tok, test::Llama2cTokenizerBytes(300));
  test::WriteFile(model, test::Llama2cCheckpoint(good));
  const ProcessRun ok = Generate(model, tok);
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  const struct {
    int index;
    int32_t value;
    const char* message;
  } cases[] = {{5, 1, "vocab_size = 300 (tied)"},
               {5, 8, "vocab_size = 300 (tied)"},
               {5, -1, "vocab_size = 300 (tied)"},
               {0, 16, "implies"},
               {4, 2, "implies"},
               {6, 0, "header field seq_len = 0"},
               {3, 3, "header field n_heads = 3"}};
  for (const auto& c : cases) {
    SCOPED_TRACE(std::to_string(c.index) + "=" + std::to_string(c.value));
    std::vector<int32_t> header = good;
    header[c.index] = c.value;
    std::string bad = test::Llama2cCheckpoint(good);
    std::memcpy(bad.data(), header.data(), header.size() * 4);
    test::WriteFile(model, bad);
    ExpectRefused(model, tok, c.message);
  }
}

TEST_F(BadModelFilesTest, ATokenizerLargerThanAConsistentTinyModelIsRefusedAtStartUp) {
  // The header says vocab_size 8 and the file is exactly that long: the model loads, but
  // the 300-token tokenizer does not belong to it.
  const std::string model = dir_ + "/model.bin", tok = dir_ + "/tok.bin";
  test::WriteFile(model, test::Llama2cCheckpoint({8, 12, 2, 2, 1, 8, 16}));
  test::WriteFile(tok, test::Llama2cTokenizerBytes(300));
  ExpectRefused(model, tok, tok + ": holds more than vocab_size = 8 tokens");
}

TEST_F(BadModelFilesTest, SafetensorsHeaderLengthOneByteShortIsRefusedNotUnk) {
  const std::string hf = dir_ + "/hf";
  std::filesystem::create_directories(hf);
  test::TinyHf spec;
  spec.vocab = 256;
  spec.WriteConfig(hf);
  test::WriteFile(hf + "/tokenizer.json", test::ByteLevelTokenizerJson());
  std::string header, data;
  spec.Tensors().Build(&header, &data);
  if (header.back() != ' ') header += std::string(8, ' ');
  const std::string weights = hf + "/model.safetensors";
  test::WriteFile(weights, test::SafetensorsBytes(header, data, header.size()));
  const ProcessRun ok = Generate(hf, "");
  ASSERT_EQ(ok.exit_code, 0) << ok.err;
  test::WriteFile(weights, test::SafetensorsBytes(header, data, header.size() - 1));
  ExpectRefused(hf, hf, weights + ": the tensors end at byte ");
  const ProcessRun bad = Generate(hf, "");
  EXPECT_NE(bad.err.find("the header must end exactly where the data begins"), std::string::npos)
      << bad.err;
  EXPECT_EQ(bad.out, "") << "no text from shifted weights";
}

// A SentencePiece model whose self_test_data does not encode as it says: libsentencepiece
// logs the failure (LOG(INFO)), which crashed `recall generate` (SIGSEGV in std::ostream: the
// module's std::cerr was never constructed); refused by name instead.
TEST_F(BadModelFilesTest, ASentencePieceModelFailingItsSelfTestIsRefusedNotACrash) {
  constexpr char kTok32k[] = "tokenizers/llama2-32k/tokenizer.model";
  RECALL_REQUIRE_SHARED_FILE(kTok32k);
  const std::string tok = dir_ + "/tokenizer.model", config = dir_ + "/config.json";
  // ModelProto.self_test_data (4) { samples (1) { input (1) "hello", expected (2) "WRONG" } }
  test::WriteFile(tok, testing::ReadFileOrEmpty(testing::SharedPath(kTok32k)) +
                           std::string("\x22\x10\x0a\x0e\x0a\x05hello\x12\x05WRONG", 18));
  test::WriteFile(config,
                  R"({"architectures": ["LlamaForCausalLM"], "model_type": "llama", )"
                  R"("hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, )"
                  R"("num_hidden_layers": 1, "num_key_value_heads": 2, "vocab_size": 32000, )"
                  R"("max_position_embeddings": 512, "rms_norm_eps": 1e-05, "hidden_act": "silu", )"
                  R"("tie_word_embeddings": true, "bos_token_id": 1, "eos_token_id": 2})");
  const ProcessRun g =
      RunProcess(dir_, RECALL_CLI_BINARY,
                 {"generate", "--random-weights", "--model", config, "--tokenizer", tok, "--prompt",
                  "Hello", "--max-tokens", "1", "--threads", "1"});
  EXPECT_TRUE(g.exit_code == 1 || g.exit_code == 2) << g.exit_code << "\n" << g.err;
  EXPECT_NE(g.err.find(tok + ": not a valid SentencePiece model (Internal: Self-test failures"),
            std::string::npos)
      << g.err;
}

}  // namespace
}  // namespace recall
