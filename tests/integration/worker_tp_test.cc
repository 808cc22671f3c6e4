// recall-worker --tp as a real process over loopback gRPC (stories260K, CPU ranks): Info
// reports the tp size; concurrent multi-turn sessions, with full caches and with lazy
// eviction in every TP eviction mode (checked on every step by --tp-verify), give exactly
// the one-rank worker's text; flags that do not fit are refused at startup with the flag
// named; a bad tp_eviction in a request is INVALID_ARGUMENT.
#include <sys/wait.h>

#include <cstdio>
#include <thread>

#include "gtest/gtest.h"
#include "tests/integration/worker_process.h"

namespace recall {
namespace {

const std::vector<std::string> kOpenings = {"Once upon a time", "Lily had a red ball",
                                            "The dog ran to the park"};

// Every session's two turns, the sessions concurrently; texts per session and turn.
std::vector<std::vector<std::string>> Converse(Worker& worker, const v1::CacheSettings& cache) {
  std::vector<std::vector<std::string>> texts(kOpenings.size());
  std::vector<std::thread> threads;
  for (size_t s = 0; s < kOpenings.size(); ++s) {
    threads.emplace_back([&, s] {
      for (int t = 0; t < 2; ++t) {
        v1::RunTurnRequest r =
            Turn("s" + std::to_string(s), t == 0 ? kOpenings[s] : "What happened next?", 40,
                 2 * t);
        *r.mutable_cache() = cache;
        TurnResult result = worker.Run(r);
        EXPECT_TRUE(result.status.ok()) << result.status.error_message();
        EXPECT_TRUE(result.has_done);
        if (t == 1) {
          EXPECT_FALSE(result.done.rebuilt());
        }
        texts[s].push_back(result.text);
      }
    });
  }
  for (auto& th : threads) th.join();
  return texts;
}

class WorkerTpTest : public ::testing::Test {
 protected:
  void SetUp() override { RECALL_REQUIRE_SHARED_FILE(kModel); }
};

TEST_F(WorkerTpTest, TwoRanksServeWhatOneRankServesInEveryEvictionMode) {
  Worker one, two;
  std::string error;
  ASSERT_TRUE(one.Start({"--kv-cache-bytes", "16M"}, &error)) << error;
  ASSERT_TRUE(two.Start({"--kv-cache-bytes", "16M", "--tp", "2", "--tp-verify"}, &error))
      << error;
  grpc::ClientContext ctx;
  v1::InfoResponse info;
  ASSERT_TRUE(two.stub().Info(&ctx, v1::InfoRequest(), &info).ok());
  EXPECT_EQ(info.tp_size(), 2);
  EXPECT_EQ(info.default_cache().tp_eviction(), "uniform");

  std::vector<v1::CacheSettings> settings(1);  // full caches first
  for (const char* mode : {"uniform", "shared", "head-adaptive"}) {
    v1::CacheSettings c;
    c.set_policy("lazy");
    c.set_budget_tokens(24);
    c.set_window(8);
    c.set_tp_eviction(mode);
    settings.push_back(c);
  }
  for (size_t i = 0; i < settings.size(); ++i) {
    const auto want = Converse(one, settings[i]);
    const auto got = Converse(two, settings[i]);
    EXPECT_EQ(got, want) << "settings " << i << ": " << settings[i].ShortDebugString();
    // Fresh sessions for the next settings (a session keeps the settings it started with).
    for (size_t s = 0; s < kOpenings.size(); ++s) {
      for (Worker* w : {&one, &two}) {
        grpc::ClientContext dctx;
        v1::DropSessionRequest drop;
        drop.set_session_id("s" + std::to_string(s));
        v1::DropSessionResponse resp;
        EXPECT_TRUE(w->stub().DropSession(&dctx, drop, &resp).ok());
      }
    }
  }
  // Lazy eviction really evicted on both ranks.
  v1::LoadReport load = two.Load();
  EXPECT_EQ(load.active_turns(), 0);
  EXPECT_EQ(two.Stop(), 0) << "clean exit on SIGTERM";
}

TEST_F(WorkerTpTest, UnknownTpEvictionIsInvalidArgumentNamingTheField) {
  Worker two;
  std::string error;
  ASSERT_TRUE(two.Start({"--kv-cache-bytes", "8M", "--tp", "2"}, &error)) << error;
  v1::RunTurnRequest r = Turn("bad", "Hello", 5);
  r.mutable_cache()->set_policy("lazy");
  r.mutable_cache()->set_tp_eviction("majority");
  TurnResult result = two.Run(r);
  EXPECT_EQ(result.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(result.status.error_message().find("cache.tp_eviction"), std::string::npos)
      << result.status.error_message();
}

// Runs recall-worker with `flags` to its exit; its exit status and what it printed.
std::pair<int, std::string> RunToExit(const std::vector<std::string>& flags) {
  std::string cmd = std::string(RECALL_WORKER_BINARY) + " --model " +
                    testing::SharedPath(kModel) + " --tokenizer " +
                    testing::SharedPath(kTokenizer) + " --listen 127.0.0.1:0";
  for (const std::string& f : flags) cmd += " " + f;
  const testing::Exit e = testing::RunToExit(cmd);
  return {e.code, e.output};
}

TEST_F(WorkerTpTest, FlagsThatDoNotFitAreRefusedAtStartupByName) {
  // stories260K has 8 query heads and 4 KV heads: tp 3 divides neither. Each case exits with
  // status 2 (invalid argument) before listening, naming the flag.
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--tp", "3"}, "tp"},
      {{"--tp", "2", "--devices", "0,1"}, "--devices: only with --device cuda"},
      {{"--device", "cuda", "--tp", "2", "--devices", "0"}, "--devices: 1 devices for --tp 2"},
      {{"--device", "cuda", "--devices", "0,x"}, "--devices"},
      {{"--device", "cuda", "--tp", "2", "--devices", "0,0"},
       "--devices: CUDA device 0 is given to two ranks"},
      {{"--tp", "2", "--tp-comm", "staged"}, "--tp-comm: only with --device cuda"},
      {{"--device", "cuda", "--tp", "2", "--tp-comm", "ring"}, "--tp-comm"},
      {{"--device", "tpu"}, "--device"},
      {{"--tp-eviction", "majority"}, "--tp-eviction"},
      {{"--tp", "2", "--kv-cache-bytes", "4K"}, "--kv-cache-bytes"},
      {{"--policy", "episodic", "--tp", "2"}, "--policy episodic: runs on one CPU rank"},
      {{"--policy", "lazy", "--budget-frac", "1.5"}, "--budget-frac"},
      {{"--embedder", "bert"}, "--embedder"},
      {{"--served-model-name", "'a b'"}, "--served-model-name: \"a b\" has a space"},
      {{"--layer-budgets", "/nonexistent/profile.json"}, "--layer-budgets"},
      {{"--layer-alpha", "9"}, "--layer-alpha"},
      {{"--listen", "127.0.0.1:99999"}, "--listen: expected HOST:PORT (port in [0, 65535])"},
      {{"--port-file", "/nonexistent/ports"}, "--port-file: cannot create /nonexistent/ports"},
  };
  for (const auto& [flags, named] : cases) {
    const auto [code, output] = RunToExit(flags);
    EXPECT_EQ(code, 2) << output;
    EXPECT_NE(output.find(named), std::string::npos) << "expected \"" << named << "\" in: " << output;
  }
}

}  // namespace
}  // namespace recall
