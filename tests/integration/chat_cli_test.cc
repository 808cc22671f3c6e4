// `recall chat` with piped input against real coordinator and worker processes: the
// transcript it prints, and a turn the server refuses (no empty reply before the error,
// the error on stderr, exit code 2).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/subprocess.h"
#include "gtest/gtest.h"
#include "tests/common/test_certs.h"
#include "tests/common/test_util.h"
#include "tests/integration/serve_processes.h"

namespace recall {
namespace {

constexpr char kModel[] = "models/stories260K/stories260K.bin";

struct ChatRun {
  int exit_code = -1;
  std::string out, err;
};

// Pipes `input` into `recall chat --server ADDRESS ... EXTRA` through the shell.
ChatRun RunChat(const std::string& dir, const std::string& address, const std::string& input,
                const std::string& extra = "") {
  const std::string in = dir + "/in.txt", out = dir + "/out.txt", err = dir + "/err.txt";
  std::ofstream(in) << input;
  const std::string cmd = std::string("'") + RECALL_CLI_BINARY + "' chat --server " + address +
                          " --max-tokens 12 --temperature 0 " + extra + " < '" + in + "' > '" +
                          out + "' 2> '" + err + "'";
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

// The sampling flags `recall generate` has reach the server from `recall chat` too: greedy
// penalties change the reply; a value out of range is a usage error naming the flag.
TEST(ChatCliTest, SamplingFlagsReachTheServer) {
  RECALL_REQUIRE_SHARED_FILE(kModel);
  const std::string dir = testing::MakeTempDir("chat_cli_sampling");
  ServerProcess worker, coordinator;
  std::string error;
  const std::string address = testing::StartServe(dir, worker, coordinator, &error);
  ASSERT_FALSE(address.empty()) << error;
  const std::string input = "Once upon a time\n/quit\n";
  ChatRun plain = RunChat(dir, address, input, "--max-tokens 24");
  ChatRun penalized =
      RunChat(dir, address, input, "--max-tokens 24 --frequency-penalty 2 --presence-penalty 1");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  ASSERT_EQ(penalized.exit_code, 0) << penalized.err;
  EXPECT_NE(penalized.out, plain.out);
  EXPECT_EQ(
      RunChat(dir, address, input, "--max-tokens 24 --frequency-penalty 2 --presence-penalty 1")
          .out,
      penalized.out)
      << "greedy: the same again";
  ChatRun bad = RunChat(dir, address, input, "--top-p 0");
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("--top-p"), std::string::npos) << bad.err;
  // A value within the flag's range but past the server's limit: the server's refusal names
  // the flag, not the request's field (sampling.max_tokens).
  ChatRun past = RunChat(dir, address, input, "--max-tokens 600");
  EXPECT_EQ(past.exit_code, 2) << past.err;
  EXPECT_NE(past.err.find("--max-tokens: must be in [1, 512] for \"stories260K.bin\", got 600"),
            std::string::npos)
      << past.err;
}

// --stop ends the reply before its text: the reply is the one without it, cut there. An
// empty one is refused naming the flag.
TEST(ChatCliTest, StopFlagCutsTheReply) {
  RECALL_REQUIRE_SHARED_FILE(kModel);
  const std::string dir = testing::MakeTempDir("chat_cli_stop");
  ServerProcess worker, coordinator;
  std::string error;
  const std::string address = testing::StartServe(dir, worker, coordinator, &error);
  ASSERT_FALSE(address.empty()) << error;
  const std::string input = "Once upon a time\n/quit\n";
  const std::string head = "user: Once upon a time\nassistant: ";
  ChatRun plain = RunChat(dir, address, input, "--max-tokens 24");
  ASSERT_EQ(plain.exit_code, 0) << plain.err;
  ASSERT_EQ(plain.out.rfind(head, 0), 0u) << plain.out;
  const std::string reply =
      plain.out.substr(head.size(), plain.out.find('\n', head.size()) - head.size());
  // Two characters from the reply's middle (greedy: the same reply comes again).
  ASSERT_GE(reply.size(), 12u) << reply;
  const std::string stop = reply.substr(reply.size() / 2, 2);
  ASSERT_EQ(stop.find('\''), std::string::npos) << stop;
  ChatRun cut = RunChat(dir, address, input, "--max-tokens 24 --stop '" + stop + "'");
  ASSERT_EQ(cut.exit_code, 0) << cut.err;
  EXPECT_EQ(cut.out, head + reply.substr(0, reply.find(stop)) + "\n") << "stop \"" << stop << '"';

  ChatRun empty = RunChat(dir, address, input, "--stop x --stop ''");
  EXPECT_EQ(empty.exit_code, 2) << empty.err;
  EXPECT_NE(empty.err.find("--stop #2: must not be empty"), std::string::npos) << empty.err;
}

// /stats shows the last reply's memory: its KV bytes, the eviction policy's state among them
// (lazy keeps ts and mri per slot), and the turn's peak.
TEST(ChatCliTest, StatsShowTheKvBytesAndThePolicysState) {
  RECALL_REQUIRE_SHARED_FILE(kModel);
  const std::string dir = testing::MakeTempDir("chat_cli_stats");
  ServerProcess worker, coordinator;
  std::string error;
  const std::string address = testing::StartServe(dir, worker, coordinator, &error);
  ASSERT_FALSE(address.empty()) << error;
  ChatRun r = RunChat(dir, address, "/stats\nOnce upon a time\n/stats\n/quit\n",
                      "--policy lazy --budget 64 --window 16");
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out.rfind("no reply has ended yet\n", 0), 0u) << "not zeros: " << r.out;
  EXPECT_EQ(r.err.find("warning"), std::string::npos) << r.err;
  // Budget flags without --policy, on a server whose default keeps every token: said.
  ChatRun full = RunChat(dir, address, "Once upon a time\n", "--budget 64");
  EXPECT_EQ(full.exit_code, 0) << full.err;
  EXPECT_NE(full.err.find("recall chat: warning: --budget: no effect: the session's policy is "
                          "full"),
            std::string::npos)
      << full.err;
  long long kv = 0, state = 0, peak = 0;
  const size_t at = r.out.find(", KV ");
  ASSERT_NE(at, std::string::npos) << r.out;
  ASSERT_EQ(std::sscanf(r.out.c_str() + at, ", KV %lld bytes (policy state %lld, peak %lld)", &kv,
                        &state, &peak),
            3)
      << r.out;
  EXPECT_GT(state, 0) << r.out;
  EXPECT_LT(state, kv) << r.out;
  EXPECT_GE(peak, kv) << r.out;
}

// Runs `recall sessions ARGS --server ADDRESS`; returns its standard output.
std::string RunSessions(const std::string& dir, const std::string& address,
                        const std::string& args) {
  const std::string out = dir + "/sessions.txt", err = dir + "/sessions.err";
  const std::string cmd = std::string("'") + RECALL_CLI_BINARY + "' sessions " + args +
                          " --server " + address + " > '" + out + "' 2> '" + err + "'";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << testing::ReadFileOrEmpty(err);
  return testing::ReadFileOrEmpty(out);
}

// A first message no worker had room for (RESOURCE_EXHAUSTED: the one worker runs one turn and
// queues none) stores nothing, and its chat leaves no session (one was left, counting against
// --max-sessions). Random weights of SmolLM2's shape: 10-30 ms a token, so the busy chat's
// 2000-token reply is still running when the second chat has sent and retried for as long as
// the SDK's retry window (about 3 s: it retries a full worker after the wait it names; a
// 400-token reply ended within it on an idle machine, and the second chat's turn was taken);
// the busy chat is ended by stopping the servers.
TEST(ChatCliTest, AFirstMessageNoWorkerHadRoomForLeavesNoSession) {
  RECALL_REQUIRE_SHARED_FILE("tokenizers/smollm2/config.json");
  const std::string dir = testing::MakeTempDir("chat_cli_full");
  const std::string busy_dir = testing::MakeTempDir("chat_cli_full_busy");
  ServerProcess worker, coordinator;
  std::string error;
  const std::string address =
      testing::StartServe(dir, worker, coordinator, &error,
                          {"--model", testing::SharedPath("tokenizers/smollm2"), "--random-weights",
                           "--kv-cache-bytes", "64M", "--max-active", "1", "--max-queued", "0"});
  ASSERT_FALSE(address.empty()) << error;
  std::thread busy([&] { RunChat(busy_dir, address, "Hello\n", "--max-tokens 2000"); });
  // The busy chat's session exists once its turn is on its way.
  for (int i = 0; i < 200 && RunSessions(dir, address, "ls").empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const ChatRun full = RunChat(dir, address, "Hi\n");
  EXPECT_EQ(full.exit_code, 1) << full.err;
  EXPECT_NE(full.err.find("worker is full"), std::string::npos) << full.err;
  EXPECT_NE(full.err.find("removed: its first message was not taken"), std::string::npos)
      << full.err;
  const std::string listed = RunSessions(dir, address, "ls");
  EXPECT_EQ(std::count(listed.begin(), listed.end(), '\n'), 1)
      << "only the busy chat's: " << listed;
  worker.Kill();
  coordinator.Kill();
  busy.join();
}

TEST(ChatCliTest, CommandsStayLocalAndAChatWithoutMessagesLeavesNoSession) {
  RECALL_REQUIRE_SHARED_FILE(kModel);
  const std::string dir = testing::MakeTempDir("chat_cli_commands");
  ServerProcess worker, coordinator;
  std::string error;
  const std::string address = testing::StartServe(dir, worker, coordinator, &error);
  ASSERT_FALSE(address.empty()) << error;

  ChatRun empty = RunChat(dir, address, "/help\n/history\n/nonsense\n/bye\n");
  EXPECT_EQ(empty.exit_code, 2) << "a refused line (the unknown command): " << empty.err;
  EXPECT_NE(empty.out.find("/new /history /stats /help /quit"), std::string::npos) << empty.out;
  EXPECT_NE(empty.out.find("(no messages yet)"), std::string::npos) << empty.out;
  EXPECT_NE(empty.err.find("unknown command /nonsense"), std::string::npos) << empty.err;
  EXPECT_EQ(empty.out.find("user:"), std::string::npos) << "no command reached the model";
  EXPECT_EQ(RunSessions(dir, address, "ls"), "") << "no session left behind";
  // An empty list says so on stderr (it printed nothing at all), the list itself stays empty.
  EXPECT_EQ(testing::ReadFileOrEmpty(dir + "/sessions.err"), "no sessions (of this tenant)\n");

  // A first message the server refuses leaves no session either.
  ChatRun refused = RunChat(dir, address, "bad \xff utf-8\n");
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_NE(refused.err.find("message: is not valid UTF-8"), std::string::npos) << refused.err;
  EXPECT_EQ(RunSessions(dir, address, "ls"), "") << "the refused first message left a session";

  ChatRun one = RunChat(dir, address, "Once upon a time\n/exit\nnot sent\n");
  EXPECT_EQ(one.exit_code, 0) << one.err;
  EXPECT_EQ(one.out.find("not sent"), std::string::npos) << one.out;
  const std::string listed = RunSessions(dir, address, "list");
  ASSERT_EQ(std::count(listed.begin(), listed.end(), '\n'), 1) << listed;
  const std::string id = listed.substr(0, listed.find(' '));
  const std::string shown = RunSessions(dir, address, "show " + id);
  EXPECT_NE(shown.find("  turns 1\n"), std::string::npos) << shown;
  EXPECT_EQ(listed.substr(listed.find("  turns=")), "  turns=1\n") << "as show counts";
  EXPECT_NE(shown.find("\nuser:\nOnce upon a time\n"), std::string::npos) << shown;
  EXPECT_NE(shown.find("\nassistant:\n"), std::string::npos) << shown;
  const std::string json = RunSessions(dir, address, "show " + id + " --json");
  EXPECT_NE(json.find("\"sessionId\": \"" + id + "\""), std::string::npos) << json;
  EXPECT_NE(json.find("\"content\": \"Once upon a time\""), std::string::npos)
      << "text as text, not base64: " << json;
  EXPECT_EQ(RunSessions(dir, address, "--json show " + id), json) << "--json anywhere";
  // Stored control characters are shown, not sent to the terminal (an escape sequence in a
  // message acted on it); /history alike.
  ChatRun bell = RunChat(dir, address, "ring \x07 \x1b[2J bell\n/history\n");
  ASSERT_EQ(bell.exit_code, 0) << bell.err;
  EXPECT_NE(bell.out.find("user: ring \\x07 \\x1b[2J bell\n"), std::string::npos) << bell.out;
  const size_t at = bell.err.find("[session ");
  ASSERT_NE(at, std::string::npos) << bell.err;
  const std::string bell_id = bell.err.substr(at + 9, bell.err.find(']', at) - at - 9);
  EXPECT_NE(RunSessions(dir, address, "show " + bell_id).find("\nring \\x07 \\x1b[2J bell\n"),
            std::string::npos);
  const testing::Exit flag_first = testing::RunToExit(
      std::string(RECALL_CLI_BINARY) + " sessions show --server " + address + " " + id + " --json");
  EXPECT_EQ(flag_first.code, 0) << flag_first.output;
  EXPECT_EQ(flag_first.output, json) << "flags before the id";

  // Mistakes are usage errors (2) that say what the command takes.
  std::ofstream(dir + "/not.pem") << "not a certificate\n";
  const auto sessions = [&](const std::string& args) {
    return testing::RunToExit(std::string(RECALL_CLI_BINARY) + " sessions " + args + " --server " +
                              address);
  };
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {"foo", "unknown sessions command \"foo\" (list, show ID [--json], delete ID)"},
           {"show a b", "show: needs one session id, got 2"},
           {"list extra", "list: takes no session id and no --json"},
           {"delete " + id + " --json", "delete: takes no --json"},
           // (It came back as a protobuf log line and "malformed protobuf".)
           {"show s-\xff", "show: the session id is not UTF-8"},
           // TLS files: a certificate without its key was taken (and a key alone ignored: a
           // plaintext call); a CA file that is no PEM read as gRPC's "empty address list".
           {"list --tls-cert " + dir + "/any.pem", "--tls-cert and --tls-key go together"},
           {"list --tls-key " + dir + "/any.pem", "--tls-cert and --tls-key go together"},
           {"list --tls-ca " + dir + "/not.pem", "--tls-ca: " + dir + "/not.pem is not PEM"}}) {
    const testing::Exit e = sessions(args);
    EXPECT_EQ(e.code, 2) << args << ": " << e.output;
    EXPECT_NE(e.output.find(message), std::string::npos) << args << ": " << e.output;
  }
  // PEM files that are not what their flag needs are said at once by name (gRPC said "empty
  // address list" after 6 s of failed handshakes).
  if (testing::HaveOpenssl()) {
    std::filesystem::create_directories(dir + "/certs");
    ASSERT_TRUE(testing::MakeTestCertificates(dir + "/certs"));
    const std::string c = dir + "/certs";
    for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
             {"list --tls-ca " + c + "/client.key",
              "--tls-ca: " + c + "/client.key holds no PEM certificate OpenSSL can read"},
             {"list --tls-ca " + c + "/ca.pem --tls-cert " + c + "/client.pem --tls-key " + c +
                  "/server.key",
              "--tls-key: " + c + "/server.key is not the key of the certificate in --tls-cert " +
                  c + "/client.pem"},
             {"list --tls-ca " + c + "/ca.pem --tls-cert " + c + "/client.key --tls-key " + c +
                  "/client.key",
              "--tls-cert: " + c + "/client.key holds no PEM certificate OpenSSL can read"}}) {
      const testing::Exit e = sessions(args);
      EXPECT_EQ(e.code, 2) << args << ": " << e.output;
      EXPECT_NE(e.output.find(message), std::string::npos) << args << ": " << e.output;
    }
  }
  // --session is checked at start (an empty id is refused: it started a new session), and a
  // new session's settings are refused with it.
  ChatRun missing = RunChat(dir, address, "hi\n", "--session s-nope");
  EXPECT_EQ(missing.exit_code, 1) << missing.err;
  EXPECT_NE(missing.err.find("--session: no session \"s-nope\""), std::string::npos) << missing.err;
  EXPECT_EQ(missing.out, "") << "nothing was sent";
  ChatRun no_id = RunChat(dir, address, "hi\n", "--session ''");
  EXPECT_EQ(no_id.exit_code, 2) << no_id.err;
  EXPECT_NE(no_id.err.find("--session: names no session (empty)"), std::string::npos) << no_id.err;
  EXPECT_EQ(no_id.out, "") << "no new session was started";
  ChatRun mixed = RunChat(dir, address, "hi\n", "--session " + id + " --system 'Be brief.'");
  EXPECT_EQ(mixed.exit_code, 2) << mixed.err;
  EXPECT_NE(mixed.err.find("--system and the cache flags"), std::string::npos) << mixed.err;
  ChatRun with_model = RunChat(dir, address, "hi\n", "--session " + id + " -m stories260K.bin");
  EXPECT_EQ(with_model.exit_code, 2) << with_model.err;
  EXPECT_NE(with_model.err.find("--model, --system"), std::string::npos) << with_model.err;
  // --model names a new session's model (needed when several are served): the served one
  // is taken, another is refused naming the served ones.
  ChatRun named = RunChat(dir, address, "Once upon a time\n", "--model stories260K.bin");
  EXPECT_EQ(named.exit_code, 0) << named.err;
  EXPECT_EQ(named.out.rfind("user: Once upon a time\nassistant:", 0), 0u) << named.out;
  ChatRun other = RunChat(dir, address, "Once upon a time\n", "--model gpt-4");
  EXPECT_EQ(other.exit_code, 1) << other.err;
  EXPECT_NE(other.err.find("no worker serves \"gpt-4\"; served: \"stories260K.bin\""),
            std::string::npos)
      << other.err;
  EXPECT_EQ(other.out, "") << other.out;
}

// Piped input as editors and Windows write it, and a bad line midway: CRLF line ends are
// line ends; blank lines are skipped; a refused line is reported and the next ones still go
// (the exit status says one was refused); a '/' line is a command and never a message (one
// with words after it is refused); a bad --api-key or --server is a usage error naming it.
TEST(ChatCliTest, CrlfInputABadLineMidwayAndCommandsWithWords) {
  RECALL_REQUIRE_SHARED_FILE(kModel);
  const std::string dir = testing::MakeTempDir("chat_cli_crlf");
  ServerProcess worker, coordinator;
  std::string error;
  const std::string address = testing::StartServe(dir, worker, coordinator, &error);
  ASSERT_FALSE(address.empty()) << error;

  ChatRun r = RunChat(dir, address,
                      "Once upon a time\r\n   \r\nbad \xff utf-8\r\nafter\r\n/quit now\r\n"
                      "/quit\r\nnever\n");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("message: is not valid UTF-8"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("/quit takes nothing after it"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("user: after\nassistant:"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("never"), std::string::npos) << "/quit (CRLF) ended the chat: " << r.out;
  EXPECT_EQ(r.out.find('\r'), std::string::npos) << r.out;
  const std::string listed = RunSessions(dir, address, "list");
  ASSERT_EQ(std::count(listed.begin(), listed.end(), '\n'), 1) << listed;
  const std::string shown = RunSessions(dir, address, "show " + listed.substr(0, listed.find(' ')));
  EXPECT_NE(shown.find("\nuser:\nOnce upon a time\n"), std::string::npos) << shown;
  EXPECT_NE(shown.find("\nuser:\nafter\n"), std::string::npos) << shown;
  EXPECT_EQ(shown.find("/quit"), std::string::npos) << shown;

  ChatRun key = RunChat(dir, address, "hi\n", "--api-key 'a\tb'");
  EXPECT_EQ(key.exit_code, 2) << key.err;
  EXPECT_NE(key.err.find("--api-key: the key must be printable ASCII"), std::string::npos)
      << key.err;
  ChatRun port = RunChat(dir, address, "hi\n", "--server 127.0.0.1:99999");
  EXPECT_EQ(port.exit_code, 2) << port.err;
  EXPECT_NE(port.err.find("--server: expected HOST:PORT (port in [0, 65535])"), std::string::npos)
      << port.err;
  ChatRun zero = RunChat(dir, address, "hi\n", "--server 127.0.0.1:0");
  EXPECT_EQ(zero.exit_code, 2) << zero.err;
  EXPECT_NE(zero.err.find("--server: port 0 names no server"), std::string::npos) << zero.err;
}

}  // namespace
}  // namespace recall
