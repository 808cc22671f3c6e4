// A conversation 40 times stories260K's context through a real `recall serve --policy lazy
// --budget 128` (a coordinator and a worker process, gRPC over loopback): every turn is
// answered, the KV bytes after each turn stay within the session's bound once it is warm, and
// the worker's resident memory from turn 20 to the end stays flat within 5%; GetSession reports
// the conversation's length and the tokens cached. And a conversation 10 contexts long through
// recall-coordinator and two recall-worker processes whose serving worker is SIGKILLed
// mid-reply: the other rebuilds the session from the transcript within the session's bound
// (the turn's peak KV bytes) and the conversation goes on. The figures are printed.
#include <dirent.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "cache/eviction/eviction_policy.h"
#include "client/client.h"
#include "common/subprocess.h"
#include "gtest/gtest.h"
#include "recall/v1/worker.grpc.pb.h"
#include "tests/common/test_util.h"

namespace recall {
namespace {

// The child of `parent` whose command is `name`, or -1.
pid_t ChildNamed(pid_t parent, const std::string& name) {
  DIR* proc = opendir("/proc");
  if (proc == nullptr) return -1;
  pid_t found = -1;
  while (dirent* e = readdir(proc)) {
    const pid_t pid = static_cast<pid_t>(std::atoi(e->d_name));
    if (pid <= 0) continue;
    std::ifstream stat("/proc/" + std::string(e->d_name) + "/stat");
    std::string line;
    std::getline(stat, line);
    // pid (comm) state ppid ...
    const size_t open = line.find('('), close = line.rfind(')');
    if (open == std::string::npos || close == std::string::npos) continue;
    const std::string comm = line.substr(open + 1, close - open - 1);
    std::istringstream rest(line.substr(close + 2));
    char state;
    pid_t ppid = -1;
    rest >> state >> ppid;
    if (ppid == parent && comm == name.substr(0, 15)) found = pid;
  }
  closedir(proc);
  return found;
}

// lazy's per-slot state (ts and mri of every layer's 4 KV heads), which the session holds
// beside its KV blocks and the worker counts in its KV bytes: as many slots as the blocks.
int64_t LazyStateBound() {
  return 5 * 4 *
         recall::cache::eviction::HeadStateBytesBound(
             recall::cache::eviction::kTsArray | recall::cache::eviction::kMriArray,
             128 + 32 + 64 + 1);
}

// VmRSS of `pid` in KiB (0 if unknown).
int64_t RssKib(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string key;
  while (status >> key) {
    if (key == "VmRSS:") {
      int64_t kib = 0;
      status >> kib;
      return kib;
    }
    std::string rest;
    std::getline(status, rest);
  }
  return 0;
}

TEST(EndlessServeTest, AConversationFortyTimesTheContextRunsInBoundedMemory) {
  RECALL_REQUIRE_SHARED_FILE("models/stories260K/stories260K.bin");
  const std::string dir = testing::MakeTempDir("endless");
  ServerProcess serve;
  std::string error;
  ASSERT_TRUE(
      serve.Start(RECALL_CLI_BINARY,
                  {"serve", "--model", testing::SharedPath("models/stories260K/stories260K.bin"),
                   "--tokenizer", testing::SharedPath("models/stories260K/tok512.bin"), "--listen",
                   "127.0.0.1:0", "--http-listen", "off", "--data-dir", dir, "--policy", "lazy",
                   "--budget", "128", "--threads", "1", "--kv-cache-bytes", "64M"},
                  dir, &error, std::chrono::seconds(120)))
      << error;
  const pid_t worker = ChildNamed(serve.pid(), "recall-worker");
  ASSERT_GT(worker, 0) << "cannot find recall serve's worker process";
  auto client = Client::Connect({.address = "127.0.0.1:" + std::to_string(serve.port("grpc"))});
  auto session = client->CreateSession(v1::CreateSessionRequest());
  ASSERT_TRUE(session.ok()) << session.status();

  const char* lines[] = {
      "Tom went to the park with his red ball.", "What did Tom see near the big tree?",
      "Lily wanted to play with the ball too.",  "Why was the dog barking at the cat?",
      "Then the sun went down and it was late.", "Where did the bird fly after that?",
      "Mom made a cake for the little girl.",    "How did the story end for Tom and Lily?"};
  v1::SamplingParams sampling;
  sampling.set_max_tokens(120);
  sampling.set_temperature(0.8f);
  sampling.set_seed(7);
  constexpr int kMaxTurns = 300, kWarm = 20;
  const int context = 512;
  int64_t tokens = 0, kv_min = INT64_MAX, kv_max = 0, rss_warm = 0, rss_max = 0;
  int turns = 0;
  // At least 160 turns, and on until the conversation is 40 contexts long.
  for (int turn = 0; turn < kMaxTurns && (turn < 160 || tokens < 40 * context); ++turn) {
    turns = turn + 1;
    SCOPED_TRACE(turn);
    absl::StatusOr<v1::ConverseDone> done = client->Converse(session->session_id(), lines[turn % 8],
                                                             sampling, [](const std::string&) {});
    ASSERT_TRUE(done.ok()) << "turn " << turn << ": " << done.status();
    ASSERT_GT(done->usage().generated_tokens(), 0);
    tokens = done->usage().prompt_tokens() + done->usage().generated_tokens();
    if (turn >= kWarm) {
      kv_min = std::min(kv_min, done->kv_bytes());
      kv_max = std::max(kv_max, done->kv_bytes());
      const int64_t rss = RssKib(worker);
      if (turn == kWarm) rss_warm = rss;
      rss_max = std::max(rss_max, rss);
    }
  }
  // budget + window + one prefill chunk (+ the token being fed), in 16-token blocks, over
  // stories260K's 5 layers of 4 KV heads x 8 elements x (K, V) x 2 bytes (bf16, the default
  // KV type) x 16 tokens.
  const int64_t block_bytes = 4 * 8 * 2 * 2 * 16;
  const int64_t bound = int64_t{(128 + 32 + 64 + 1 + 15) / 16} * 5 * block_bytes + LazyStateBound();
  std::printf(
      "endless: %d turns, %lld tokens (%.1fx the %d-token context); KV after each turn "
      "from turn %d: %lld..%lld bytes (bound %lld); worker RSS %lld KiB at turn %d, at "
      "most %lld KiB after (%+.1f%%)\n",
      turns, static_cast<long long>(tokens), static_cast<double>(tokens) / context, context, kWarm,
      static_cast<long long>(kv_min), static_cast<long long>(kv_max), static_cast<long long>(bound),
      static_cast<long long>(rss_warm), kWarm, static_cast<long long>(rss_max),
      100.0 * (static_cast<double>(rss_max) / std::max<int64_t>(rss_warm, 1) - 1));
  EXPECT_GE(tokens, 40 * context);
  EXPECT_LE(kv_max, bound);
  EXPECT_GT(rss_warm, 0);
  EXPECT_LE(rss_max, rss_warm * 105 / 100) << "worker RSS grew more than 5%";
  auto stored = client->GetSession(session->session_id());
  ASSERT_TRUE(stored.ok()) << stored.status();
  EXPECT_EQ(stored->total_tokens(), tokens) << "the conversation's length";
  EXPECT_GT(stored->held_tokens(), 0);
  EXPECT_LE(stored->held_tokens(), 128 + 32 + 64 + 1) << "the tokens cached";
}

// Worker i's load (empty if it does not answer).
v1::LoadReport Load(int port) {
  auto stub = v1::Worker::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  v1::LoadReport load;
  if (!stub->GetLoad(&ctx, v1::GetLoadRequest(), &load).ok()) load.Clear();
  return load;
}

TEST(EndlessServeTest, ALongConversationSurvivesItsWorkerKilledMidReplyInBoundedMemory) {
  RECALL_REQUIRE_SHARED_FILE("models/stories260K/stories260K.bin");
  const std::string dir = testing::MakeTempDir("endless_failover");
  ServerProcess workers[2], coordinator;
  std::string error;
  for (ServerProcess& w : workers) {
    ASSERT_TRUE(w.Start(
        RECALL_WORKER_BINARY,
        {"--model", testing::SharedPath("models/stories260K/stories260K.bin"), "--tokenizer",
         testing::SharedPath("models/stories260K/tok512.bin"), "--listen", "127.0.0.1:0",
         "--policy", "lazy", "--budget", "128", "--threads", "1", "--kv-cache-bytes", "64M"},
        dir, &error))
        << error;
  }
  const int ports[2] = {workers[0].port("grpc"), workers[1].port("grpc")};
  ASSERT_TRUE(coordinator.Start(
      RECALL_COORDINATOR_BINARY,
      {"--workers",
       "127.0.0.1:" + std::to_string(ports[0]) + ",127.0.0.1:" + std::to_string(ports[1]),
       "--listen", "127.0.0.1:0", "--data-dir", dir},
      dir, &error))
      << error;
  auto client =
      Client::Connect({.address = "127.0.0.1:" + std::to_string(coordinator.port("grpc"))});
  auto session = client->CreateSession(v1::CreateSessionRequest());
  ASSERT_TRUE(session.ok()) << session.status();
  v1::SamplingParams sampling;
  sampling.set_max_tokens(120);
  sampling.set_temperature(0.8f);
  sampling.set_seed(11);
  const char* lines[] = {"Tom went to the park.", "What did he see?", "Lily came too.",
                         "Then what happened?"};
  const int context = 512;
  // budget + window + one prefill chunk (+ the token fed), in blocks (as above).
  const int64_t block_bytes = 4 * 8 * 2 * 2 * 16;
  const int64_t bound = int64_t{(128 + 32 + 64 + 1 + 15) / 16} * 5 * block_bytes + LazyStateBound();
  int64_t tokens = 0;
  int turn = 0;
  for (; tokens < 10 * context; ++turn) {
    auto done = client->Converse(session->session_id(), lines[turn % 4], sampling,
                                 [](const std::string&) {});
    ASSERT_TRUE(done.ok()) << "turn " << turn << ": " << done.status();
    tokens = done->usage().prompt_tokens() + done->usage().generated_tokens();
  }
  // The next reply: its worker is killed once the first tokens arrive. As long a reply as the
  // worker allows (the context), so that it is still running when a loaded machine delivers
  // the first tokens (a 120-token reply may end first: it failed once under ctest -j2).
  int killed = -1;
  v1::SamplingParams long_reply = sampling;
  long_reply.set_max_tokens(context);
  auto done =
      client->Converse(session->session_id(), "And then?", long_reply, [&](const std::string&) {
        if (killed >= 0) return;
        for (int i = 0; i < 2 && killed < 0; ++i) {
          if (Load(ports[i]).active_turns() > 0) killed = i;
        }
        if (killed >= 0) workers[killed].Kill();
      });
  ASSERT_GE(killed, 0) << "no worker was seen running the turn";
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(done->failovers(), 1);
  EXPECT_TRUE(done->rebuilt()) << "the survivor rebuilt the session from the transcript";
  std::printf(
      "endless failover: a %lld-token conversation (%.1fx the context) rebuilt on the "
      "surviving worker with peak KV %lld bytes (bound %lld), held %lld after\n",
      static_cast<long long>(tokens), static_cast<double>(tokens) / context,
      static_cast<long long>(done->peak_kv_bytes()), static_cast<long long>(bound),
      static_cast<long long>(done->kv_bytes()));
  EXPECT_GT(done->peak_kv_bytes(), 0);
  EXPECT_LE(done->peak_kv_bytes(), bound) << "the rebuild stayed within the session's bound";
  // The conversation goes on, on the survivor, within the bound.
  for (int more = 0; more < 5; ++more) {
    auto next = client->Converse(session->session_id(), lines[more % 4], sampling,
                                 [](const std::string&) {});
    ASSERT_TRUE(next.ok()) << next.status();
    EXPECT_LE(next->kv_bytes(), bound);
    EXPECT_EQ(next->worker(), "127.0.0.1:" + std::to_string(ports[1 - killed]));
  }
}

}  // namespace
}  // namespace recall
