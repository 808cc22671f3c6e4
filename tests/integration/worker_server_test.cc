// recall-worker as a real process over loopback gRPC, on stories260K: health, info,
// concurrent multi-turn sessions (batched equals alone for greedy, cache reuse across
// turns), cancellation freeing blocks, a slow reader getting coalesced tokens, pool
// exhaustion (offload / queue / RESOURCE_EXHAUSTED, never a crash), metrics, and every bad
// input getting its status code.
#include <atomic>
#include <functional>
#include <limits>
#include <thread>

#include "absl/strings/str_cat.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"
#include "tests/integration/http_get.h"
#include "tests/integration/raw_call.h"
#include "tests/integration/worker_process.h"

namespace recall {
namespace {

class WorkerServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    RECALL_REQUIRE_SHARED_FILE(kModel);
    std::string error;
    ASSERT_TRUE(worker_.Start({"--kv-cache-bytes", "16M"}, &error)) << error;
  }
  Worker worker_;
};

const std::vector<std::string> kPrompts = {"Once upon a time", "Lily had a red ball",
                                           "The dog ran to the park", "Tom was sad"};

TEST_F(WorkerServerTest, HealthAndInfo) {
  auto health = grpc::health::v1::Health::NewStub(worker_.channel());
  grpc::ClientContext ctx;
  grpc::health::v1::HealthCheckResponse resp;
  ASSERT_TRUE(health->Check(&ctx, grpc::health::v1::HealthCheckRequest(), &resp).ok());
  EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  // Probes that name the service (grpc_health_probe -service=recall.v1.Worker) are answered
  // too; a service the worker does not serve is NOT_FOUND.
  grpc::health::v1::HealthCheckRequest named;
  named.set_service("recall.v1.Worker");
  grpc::ClientContext nctx;
  ASSERT_TRUE(health->Check(&nctx, named, &resp).ok());
  EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  named.set_service("recall.v1.Chat");
  grpc::ClientContext uctx;
  EXPECT_EQ(health->Check(&uctx, named, &resp).error_code(), grpc::StatusCode::NOT_FOUND);

  grpc::ClientContext ictx;
  v1::InfoResponse info;
  ASSERT_TRUE(worker_.stub().Info(&ictx, v1::InfoRequest(), &info).ok());
  EXPECT_EQ(info.context_length(), 512);
  EXPECT_EQ(info.tp_size(), 1);
  EXPECT_EQ(info.default_cache().policy(), "full");
  EXPECT_EQ(info.default_cache().kv_dtype(), "bf16") << "the default KV type";
  EXPECT_NE(std::find(info.policies().begin(), info.policies().end(), "lazy"),
            info.policies().end());
  EXPECT_EQ(info.max_tokens_limit(), 512);
  EXPECT_EQ(info.model(), "stories260K.bin") << "the model path's last component";
}

// A second worker on a port the first holds exits saying why (the system's reason).
TEST_F(WorkerServerTest, AWorkerOnATakenPortExitsSayingTheAddressIsInUse) {
  const std::string address = worker_.address();
  const testing::Exit taken = testing::RunToExit(
      absl::StrCat(RECALL_WORKER_BINARY, " --model ", testing::SharedPath(kModel), " --tokenizer ",
                   testing::SharedPath(kTokenizer), " --listen ", address,
                   " --threads 1 --kv-cache-bytes 16M"),
      60);
  EXPECT_NE(taken.code, 0) << taken.output;
  EXPECT_NE(taken.output.find("--listen: cannot listen on " + address + ": Address already in use"),
            std::string::npos)
      << taken.output;
}

// --served-model-name is the name the worker gives its model.
TEST_F(WorkerServerTest, AServedModelNameReplacesTheFileName) {
  Worker named;
  std::string error;
  ASSERT_TRUE(
      named.Start({"--kv-cache-bytes", "16M", "--served-model-name", "tiny-stories"}, &error))
      << error;
  grpc::ClientContext ctx;
  v1::InfoResponse info;
  ASSERT_TRUE(named.stub().Info(&ctx, v1::InfoRequest(), &info).ok());
  EXPECT_EQ(info.model(), "tiny-stories");
}

// A session may name the worker's KV type (or none); another type, or one that does not
// exist, is INVALID_ARGUMENT naming cache.kv_dtype, and the session is not created.
TEST_F(WorkerServerTest, ASessionMayNameOnlyTheWorkersKvType) {
  v1::RunTurnRequest same = Turn("kv_same", "Once upon a time", 8, 0);
  same.mutable_cache()->set_kv_dtype("bf16");
  EXPECT_TRUE(worker_.Run(same).status.ok());
  for (const char* t : {"int8", "fp8"}) {
    v1::RunTurnRequest other = Turn(std::string("kv_") + t, "Once upon a time", 8, 0);
    other.mutable_cache()->set_kv_dtype(t);
    const TurnResult r = worker_.Run(other);
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << t;
    EXPECT_NE(r.status.error_message().find("cache.kv_dtype"), std::string::npos)
        << r.status.error_message();
    EXPECT_NE(r.status.error_message().find(std::string(t) == "int8" ? "stores bf16" : "one of"),
              std::string::npos)
        << r.status.error_message();
  }
}

TEST_F(WorkerServerTest, ConcurrentMultiTurnSessionsMatchSessionsRunAlone) {
  const int kTurns = 3;
  const std::vector<std::string> followups = {"", "What happened next?", "And then?"};
  // Alone: one session at a time.
  std::vector<std::vector<std::string>> alone(kPrompts.size());
  for (size_t s = 0; s < kPrompts.size(); ++s) {
    for (int t = 0; t < kTurns; ++t) {
      TurnResult r = worker_.Run(
          Turn("alone" + std::to_string(s), t == 0 ? kPrompts[s] : followups[t], 30, 2 * t));
      ASSERT_TRUE(r.status.ok()) << r.status.error_message();
      alone[s].push_back(r.text);
    }
  }
  // Concurrently, turns interleaved across sessions.
  std::vector<std::vector<TurnResult>> together(kPrompts.size());
  std::vector<std::thread> threads;
  for (size_t s = 0; s < kPrompts.size(); ++s) {
    threads.emplace_back([&, s] {
      for (int t = 0; t < kTurns; ++t) {
        together[s].push_back(worker_.Run(
            Turn("conc" + std::to_string(s), t == 0 ? kPrompts[s] : followups[t], 30, 2 * t)));
      }
    });
  }
  for (auto& th : threads) th.join();
  for (size_t s = 0; s < kPrompts.size(); ++s) {
    for (int t = 0; t < kTurns; ++t) {
      const TurnResult& r = together[s][t];
      ASSERT_TRUE(r.status.ok()) << r.status.error_message();
      ASSERT_TRUE(r.has_done);
      EXPECT_EQ(r.text, alone[s][t]) << "session " << s << " turn " << t;
      EXPECT_EQ(r.done.usage().generated_tokens(), static_cast<int>(r.tokens.size()));
      if (t > 0) {
        // Follow-ups reuse the cache: only the new message is prefilled.
        EXPECT_GT(r.done.usage().cached_tokens(), 0);
        EXPECT_LT(r.done.usage().prompt_tokens() - r.done.usage().cached_tokens(), 40);
        EXPECT_FALSE(r.done.rebuilt());
      }
    }
  }
}

TEST_F(WorkerServerTest, CancellingTheStreamStopsTheTurnAndFreesItsBlocks) {
  const int64_t total = worker_.Load().kv_blocks_total();
  grpc::ClientContext ctx;
  auto reader = worker_.stub().RunTurn(&ctx, Turn("cancel", "Once upon a time", 500));
  v1::TurnEvent ev;
  ASSERT_TRUE(reader->Read(&ev));
  ctx.TryCancel();
  while (reader->Read(&ev)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  v1::LoadReport load;
  for (int i = 0; i < 200; ++i) {
    load = worker_.Load();
    if (load.kv_blocks_free() == total && load.active_turns() == 0) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(load.kv_blocks_free(), total);
  EXPECT_EQ(load.active_turns(), 0);
}

// An idle lazy session's eviction state is held in the pool: GetLoad reports it as side
// memory, covered by lent blocks that are not free, and it goes with the session.
TEST_F(WorkerServerTest, ALazySessionsStateIsReportedAndHeldInThePool) {
  const int64_t total = worker_.Load().kv_blocks_total();
  v1::RunTurnRequest r = Turn("lazy", "Once upon a time", 120);
  r.mutable_cache()->set_policy("lazy");
  r.mutable_cache()->set_budget_tokens(64);
  r.mutable_cache()->set_window(16);
  const TurnResult t = worker_.Run(r);
  ASSERT_TRUE(t.status.ok()) << t.status.error_message();
  const int64_t state = t.done.state_bytes();
  ASSERT_GT(state, 0);
  v1::LoadReport load;
  for (int i = 0; i < 200; ++i) {  // published after the engine's step
    load = worker_.Load();
    if (load.active_turns() == 0 && load.side_bytes() == state) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(load.side_bytes(), state);
  EXPECT_EQ(load.side_blocks(), (state + load.kv_block_bytes() - 1) / load.kv_block_bytes());
  const int64_t kv_blocks = (t.done.kv_bytes() - state) / load.kv_block_bytes();
  EXPECT_EQ(load.kv_blocks_free(), total - kv_blocks - load.side_blocks());
  grpc::ClientContext ctx;
  v1::DropSessionRequest drop;
  drop.set_session_id("lazy");
  v1::DropSessionResponse dropped;
  ASSERT_TRUE(worker_.stub().DropSession(&ctx, drop, &dropped).ok());
  for (int i = 0; i < 200 && worker_.Load().side_bytes() != 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  load = worker_.Load();
  EXPECT_EQ(load.side_bytes(), 0);
  EXPECT_EQ(load.side_blocks(), 0);
  EXPECT_EQ(load.kv_blocks_free(), total);
}

TEST_F(WorkerServerTest, ASlowReaderGetsCoalescedTokensAndTheWholeText) {
  TurnResult fast = worker_.Run(Turn("fast", "Once upon a time", 200));
  ASSERT_TRUE(fast.status.ok());
  worker_.UseSmallWindow();
  // The reader starts once the turn has decoded all its tokens (its session is resident and
  // nothing runs), so most of them wait for a window that holds a few: a fixed 1.5 s wait was
  // shorter than the decode on a loaded machine, and then tokens went out one by one.
  const int resident = worker_.Load().resident_sessions();
  bool decoded = false;
  TurnResult slow = worker_.Run(Turn("slow", "Once upon a time", 200), [&] {
    for (int i = 0; i < 6000 && !decoded; ++i) {
      const v1::LoadReport load = worker_.Load();
      decoded = load.resident_sessions() > resident && load.active_turns() == 0 &&
                load.queued_turns() == 0;
      if (!decoded) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  });
  ASSERT_TRUE(decoded) << "the turn did not end its decode within 60 s";
  ASSERT_TRUE(slow.status.ok());
  EXPECT_EQ(slow.text, fast.text);
  EXPECT_EQ(slow.tokens, fast.tokens);
  EXPECT_LT(slow.token_events, static_cast<int>(slow.tokens.size()) / 2)
      << "pending tokens should have been coalesced into few messages";
}

TEST_F(WorkerServerTest, BadInputsGetTheirCodes) {
  struct Case {
    std::string name;
    v1::RunTurnRequest request;
    grpc::StatusCode code;
    std::string mentions;
  };
  std::vector<Case> cases;
  auto add = [&](const std::string& name, grpc::StatusCode code, const std::string& mentions,
                 auto edit) {
    v1::RunTurnRequest r = Turn("bad-" + name, "Once upon a time", 10);
    edit(r);
    cases.push_back({name, r, code, mentions});
  };
  using grpc::StatusCode;
  add("negative temperature", StatusCode::INVALID_ARGUMENT, "sampling.temperature",
      [](auto& r) { r.mutable_sampling()->set_temperature(-1); });
  add("top_p zero", StatusCode::INVALID_ARGUMENT, "sampling.top_p",
      [](auto& r) { r.mutable_sampling()->set_top_p(0); });
  add("top_p above one", StatusCode::INVALID_ARGUMENT, "(0, 1]",
      [](auto& r) { r.mutable_sampling()->set_top_p(1.5f); });
  add("logit_bias past the vocabulary", StatusCode::INVALID_ARGUMENT,
      "sampling.logit_bias: token 512 is outside the vocabulary [0, 512)",
      [](auto& r) { (*r.mutable_sampling()->mutable_logit_bias())[512] = 1; });
  add("logit_bias out of range", StatusCode::INVALID_ARGUMENT,
      "sampling.logit_bias: token 7: the bias must be in [-100, 100], got inf", [](auto& r) {
        (*r.mutable_sampling()->mutable_logit_bias())[7] = std::numeric_limits<float>::infinity();
      });
  add("frequency_penalty out of range", StatusCode::INVALID_ARGUMENT,
      "sampling.frequency_penalty: must be in [-2, 2], got 2.5",
      [](auto& r) { r.mutable_sampling()->set_frequency_penalty(2.5f); });
  add("presence_penalty not a number", StatusCode::INVALID_ARGUMENT,
      "sampling.presence_penalty: must be in [-2, 2], got nan", [](auto& r) {
        r.mutable_sampling()->set_presence_penalty(std::numeric_limits<float>::quiet_NaN());
      });
  add("top_logprobs without logprobs", StatusCode::INVALID_ARGUMENT,
      "sampling.top_logprobs: needs sampling.logprobs",
      [](auto& r) { r.mutable_sampling()->set_top_logprobs(3); });
  add("top_logprobs over 20", StatusCode::INVALID_ARGUMENT,
      "sampling.top_logprobs: must be in [0, 20], got 21", [](auto& r) {
        r.mutable_sampling()->set_logprobs(true);
        r.mutable_sampling()->set_top_logprobs(21);
      });
  add("max_tokens zero", StatusCode::INVALID_ARGUMENT, "sampling.max_tokens",
      [](auto& r) { r.mutable_sampling()->set_max_tokens(0); });
  add("max_tokens over the limit", StatusCode::INVALID_ARGUMENT, "512",
      [](auto& r) { r.mutable_sampling()->set_max_tokens(100000); });
  add("invalid utf-8", StatusCode::INVALID_ARGUMENT, "messages[0].content",
      [](auto& r) { r.mutable_messages(0)->set_content("ok \xc3\x28 bad"); });
  add("unknown policy", StatusCode::INVALID_ARGUMENT, "cache.policy",
      [](auto& r) { r.mutable_cache()->set_policy("fifo"); });
  add("unknown role", StatusCode::INVALID_ARGUMENT, "messages[0].role",
      [](auto& r) { r.mutable_messages(0)->set_role("robot"); });
  add("no session id", StatusCode::INVALID_ARGUMENT, "session_id",
      [](auto& r) { r.clear_session_id(); });
  add("no messages", StatusCode::INVALID_ARGUMENT, "messages",
      [](auto& r) { r.clear_messages(); });
  add("unknown session without history", StatusCode::FAILED_PRECONDITION, "resend with history",
      [](auto& r) { r.set_history_length(4); });
  add("longer than the context", StatusCode::INVALID_ARGUMENT, "context length", [](auto& r) {
    std::string text;
    for (int i = 0; i < 200; ++i) text += "the cat sat. ";
    r.mutable_messages(0)->set_content(text);
  });
  for (const Case& c : cases) {
    TurnResult r = worker_.Run(c.request);
    EXPECT_EQ(r.status.error_code(), c.code) << c.name << ": " << r.status.error_message();
    EXPECT_NE(r.status.error_message().find(c.mentions), std::string::npos)
        << c.name << ": " << r.status.error_message();
    EXPECT_TRUE(r.tokens.empty()) << c.name;
    // The one error that asks for the history says so in the protocol, not only in words.
    EXPECT_EQ(r.history_needed.has_value(), c.code == StatusCode::FAILED_PRECONDITION) << c.name;
  }
  grpc::ClientContext ctx;
  v1::DropSessionRequest drop;
  drop.set_session_id("never-seen");
  v1::DropSessionResponse resp;
  EXPECT_EQ(worker_.stub().DropSession(&ctx, drop, &resp).error_code(), StatusCode::NOT_FOUND);
  grpc::ClientContext actx;
  v1::AbortResponse aresp;
  EXPECT_EQ(worker_.stub().Abort(&actx, v1::AbortRequest(), &aresp).error_code(),
            StatusCode::INVALID_ARGUMENT);
  // The worker is fine after all that.
  EXPECT_TRUE(worker_.Run(Turn("after", "Once upon a time", 5)).status.ok());
}

// CheckSession refuses exactly what a new session's first turn would, with the same code and
// field; what it passes, the turn takes.
// A request gRPC cannot parse (bytes that are no protobuf, a session_id that is not UTF-8):
// the worker's calls are on the callback API, whose answer was UNIMPLEMENTED with an empty
// message, as if the method did not exist. A method that does not exist stays UNIMPLEMENTED.
TEST_F(WorkerServerTest, ARequestThatCannotBeParsedIsInvalidArgumentNamingTheMethod) {
  for (const std::string method :
       {"/recall.v1.Worker/RunTurn", "/recall.v1.Worker/DropSession", "/recall.v1.Worker/Abort"}) {
    for (const std::string& bytes :
         {std::string("\xff\xff\xff\xff", 4), std::string("\x0a\x02\xff\xfe", 4)}) {
      const grpc::Status st = testing::RawCall(worker_.channel().get(), method, bytes, "");
      EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
          << method << ": " << st.error_message();
      EXPECT_NE(st.error_message().find(method), std::string::npos) << st.error_message();
    }
  }
  EXPECT_EQ(
      testing::RawCall(worker_.channel().get(), "/recall.v1.Worker/Nope", "", "").error_code(),
      grpc::StatusCode::UNIMPLEMENTED);
}

TEST_F(WorkerServerTest, CheckSessionRefusesWhatTheFirstTurnWould) {
  std::string story;
  while (story.size() < 4000) story += "Once upon a time there was a little girl named Lily. ";
  struct Case {
    std::string name;
    std::function<void(v1::CacheSettings*)> edit;
    std::string system_prompt;
    std::string refused;  // the message's start, "" when accepted
  };
  const std::vector<Case> cases = {
      {"defaults", [](auto*) {}, "", ""},
      {"lazy at 30%",
       [](auto* c) {
         c->set_policy("lazy");
         c->set_budget_fraction(0.3f);
       },
       "", ""},
      {"unknown policy", [](auto* c) { c->set_policy("fifo"); }, "", "cache.policy: "},
      {"window 0", [](auto* c) { c->set_window(0); }, "", "cache.window: "},
      {"alpha 1.5", [](auto* c) { c->set_alpha(1.5f); }, "", "cache.alpha: "},
      {"budget below the window",
       [](auto* c) {
         c->set_policy("lazy");
         c->set_budget_tokens(2);
       },
       "", "cache.budget_tokens: 2 is below"},
      {"full cannot compact", [](auto* c) { c->set_positions("compact"); }, "",
       "cache.positions: "},
      {"unknown positions", [](auto* c) { c->set_positions("sideways"); }, "", "cache.positions: "},
      {"too many episodes",
       [](auto* c) {
         c->set_policy("episodic");
         c->set_episodes(99);
       },
       "", "cache.episodes: "},
      {"another KV type", [](auto* c) { c->set_kv_dtype("int8"); }, "", "cache.kv_dtype: "},
      {"a system prompt past the context, kept whole", [](auto*) {}, story, "system_prompt: "},
      {"a system prompt past the context, compacted",
       [](auto* c) {
         c->set_policy("lazy");
         c->set_budget_tokens(64);
       },
       story, ""},
  };
  for (const Case& c : cases) {
    grpc::ClientContext ctx;
    v1::CheckSessionRequest check;
    c.edit(check.mutable_cache());
    check.set_system_prompt(c.system_prompt);
    v1::CheckSessionResponse checked;
    const grpc::Status st = worker_.stub().CheckSession(&ctx, check, &checked);
    v1::RunTurnRequest first = Turn("check-" + c.name, "Hello", 4, 0);
    *first.mutable_cache() = check.cache();
    if (!c.system_prompt.empty()) {
      v1::ChatMessage user = first.messages(0);
      first.mutable_messages(0)->set_role("system");
      first.mutable_messages(0)->set_content(c.system_prompt);
      *first.add_messages() = user;
    }
    const TurnResult turn = worker_.Run(first);
    if (c.refused.empty()) {
      EXPECT_TRUE(st.ok()) << c.name << ": " << st.error_message();
      EXPECT_TRUE(turn.status.ok()) << c.name << ": " << turn.status.error_message();
      if (!c.system_prompt.empty()) {
        EXPECT_GT(checked.system_prompt_tokens(), 512) << c.name;
      }
      continue;
    }
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.name;
    EXPECT_EQ(st.error_message().rfind(c.refused, 0), 0u) << c.name << ": " << st.error_message();
    EXPECT_EQ(turn.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << c.name << ": the turn was not refused";
    if (c.system_prompt.empty()) {
      EXPECT_EQ(turn.status.error_message(), st.error_message()) << c.name;
    } else {  // the turn names its messages
      EXPECT_NE(turn.status.error_message().find("context length is 512"), std::string::npos)
          << turn.status.error_message();
    }
  }
  // Bytes that are not UTF-8.
  grpc::ClientContext ctx;
  v1::CheckSessionRequest check;
  check.set_system_prompt("bad \xff");
  v1::CheckSessionResponse checked;
  const grpc::Status st = worker_.stub().CheckSession(&ctx, check, &checked);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(st.error_message(), "system_prompt: is not valid UTF-8");
}

TEST_F(WorkerServerTest, MetricsCountTurnsAndTokens) {
  ASSERT_TRUE(worker_.Run(Turn("m", "Once upon a time", 10)).status.ok());
  const std::string text = testing::HttpGet(worker_.metrics_port(), "/metrics");
  EXPECT_NE(text.find("# TYPE recall_worker_turns_total counter"), std::string::npos) << text;
  EXPECT_EQ(text.find("recall_worker_generated_tokens_total 0\n"), std::string::npos);
  EXPECT_NE(text.find("recall_worker_kv_blocks_total "), std::string::npos);
  EXPECT_NE(text.find("recall_worker_time_to_first_token_seconds_bucket"), std::string::npos);
}

TEST(WorkerServerPressureTest, PoolExhaustionOffloadsQueuesOrRefusesButNeverCrashes) {
  RECALL_REQUIRE_SHARED_FILE(kModel);
  Worker worker;
  std::string error;
  // 120 KiB: 60 blocks of 2 KiB (16 tokens of one layer in bf16, the default KV type), room
  // for 12 x 16 tokens in all 5 layers: about two sessions of ~90 tokens resident at a time;
  // one turn running and one waiting at most.
  ASSERT_TRUE(worker.Start({"--kv-cache-bytes", "122880", "--max-active", "2", "--max-queued", "1"},
                           &error))
      << error;
  std::vector<TurnResult> results(8);
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      results[i] = worker.Run(Turn("p" + std::to_string(i), kPrompts[i % 4], 60));
    });
  }
  for (auto& t : threads) t.join();
  int ok = 0, refused = 0;
  for (const TurnResult& r : results) {
    if (r.status.ok()) {
      ++ok;
    } else {
      EXPECT_EQ(r.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
          << r.status.error_message();
      EXPECT_NE(r.status.error_message().find("retry after"), std::string::npos);
      ++refused;
    }
  }
  EXPECT_GE(ok, 3);
  EXPECT_GE(refused, 1);
  // Idle sessions were offloaded to make room, and the worker still serves.
  const std::string metrics = testing::HttpGet(worker.metrics_port(), "/metrics");
  EXPECT_EQ(metrics.find("recall_worker_offloads_total 0\n"), std::string::npos) << metrics;
  // A session whose turn went through continues (from its offloaded or resident cache).
  const auto served = std::find_if(results.begin(), results.end(),
                                   [](const TurnResult& r) { return r.status.ok(); });
  ASSERT_NE(served, results.end());
  const std::string id = "p" + std::to_string(served - results.begin());
  EXPECT_TRUE(worker.Run(Turn(id, "and then?", 10, 2)).status.ok());
  EXPECT_EQ(worker.Stop(), 0) << "clean exit on SIGTERM";
}

}  // namespace
}  // namespace recall
