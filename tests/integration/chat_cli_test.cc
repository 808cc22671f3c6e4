// `recall chat` with piped input against real coordinator and worker processes: the
// transcript it prints, and a turn the server refuses (no empty reply before the error,
// the error on stderr, exit code 2).
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "common/subprocess.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"
#include "tests/integration/serve_processes.h"

namespace recall {
namespace {

constexpr char kModel[] = "models/stories260K/stories260K.bin";

struct ChatRun {
  int exit_code = -1;
  std::string out, err;
};

// Pipes `input` into `recall chat --server ADDRESS ...` through the shell.
ChatRun RunChat(const std::string& dir, const std::string& address, const std::string& input) {
  const std::string in = dir + "/in.txt", out = dir + "/out.txt", err = dir + "/err.txt";
  std::ofstream(in) << input;
  const std::string cmd = std::string("'") + RECALL_CLI_BINARY + "' chat --server " + address +
                          " --max-tokens 12 --temperature 0 < '" + in + "' > '" + out + "' 2> '" +
                          err + "'";
  ChatRun r;
  const int status = std::system(cmd.c_str());
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = testing::ReadFileOrEmpty(out);
  r.err = testing::ReadFileOrEmpty(err);
  return r;
}

TEST(ChatCliTest, PipedTranscriptAndARefusedTurn) {
  RECALL_REQUIRE_SHARED_FILE(kModel);
  const std::string dir = testing::MakeTempDir("chat_cli");
  ServerProcess worker, coordinator;
  std::string error;
  const std::string address = testing::StartServe(dir, worker, coordinator, &error);
  ASSERT_FALSE(address.empty()) << error;

  ChatRun ok = RunChat(dir, address, "Once upon a time\n/quit\n");
  EXPECT_EQ(ok.exit_code, 0) << ok.err;
  ASSERT_EQ(ok.out.rfind("user: Once upon a time\nassistant:", 0), 0u) << ok.out;
  EXPECT_GT(ok.out.size(), std::string("user: Once upon a time\nassistant:\n").size()) << ok.out;
  EXPECT_EQ(ok.out.back(), '\n');

  // The second message needs more than the model's 512-token context: refused.
  const std::string too_long(3000, 'a');
  ChatRun refused = RunChat(dir, address, "Once upon a time\n" + too_long + "\n");
  EXPECT_EQ(refused.exit_code, 2) << refused.err;
  const std::string second = "user: " + too_long + "\n";
  const size_t at = refused.out.find(second);
  ASSERT_NE(at, std::string::npos) << refused.out;
  EXPECT_EQ(refused.out.substr(at + second.size()), "") << "nothing after the refused turn";
  EXPECT_EQ(refused.out.find("assistant:\n"), std::string::npos) << refused.out;
  EXPECT_NE(refused.err.find("context length is 512"), std::string::npos) << refused.err;
}

}  // namespace
}  // namespace recall
