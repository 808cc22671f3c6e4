// TurnRunner with a fake sink over real recall-worker processes (stories260K; random weights
// of SmolLM2-135M's shape where a turn must last long enough to be interrupted): a turn's
// tokens reach the sink once each, in order, then its done; a worker that lacks the session
// gets the transcript after its HistoryNeeded event (read then, when the spec reads it late); a
// worker that is gone, or killed mid-reply, is failed over with nothing lost or repeated; a full
// worker (RESOURCE_EXHAUSTED) is passed over for another without being marked down; a bad request
// is the worker's answer, not retried; no worker is UNAVAILABLE; a one-turn session is dropped
// before the done; Cancel ends the turn with CANCELLED and the worker's turn is gone within a
// measured bound.
#include "coordinator/turn_runner.h"

#include <atomic>
#include <filesystem>
#include <functional>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"
#include "tests/integration/worker_process.h"

namespace recall::coordinator {
namespace {

// Records what a runner reports; Wait blocks until its end (bounded).
class FakeSink final : public TurnSink {
 public:
  // Runs on the first tokens (from inside the sink call), e.g. to cancel or kill.
  std::function<void()> on_first_tokens;

  void OnTokens(const v1::TokenEvent& t) override {
    std::function<void()> hook;
    {
      absl::MutexLock lock(&mu_);
      EXPECT_EQ(ends_, 0) << "tokens after the end";
      tokens_.insert(tokens_.end(), t.token_ids().begin(), t.token_ids().end());
      text_ += t.text();
      ++token_events_;
      hook = std::move(on_first_tokens);
      on_first_tokens = nullptr;
    }
    if (hook) hook();
  }
  void OnTurnDone(TurnResult result) override {
    {
      absl::MutexLock lock(&mu_);
      ++ends_;
      result_ = std::move(result);
    }
    ended_.Notify();
  }
  void OnTurnError(absl::Status status) override {
    {
      absl::MutexLock lock(&mu_);
      ++ends_;
      error_ = std::move(status);
    }
    ended_.Notify();
  }

  bool Wait() { return ended_.WaitForNotificationWithTimeout(absl::Seconds(120)); }

  std::vector<int32_t> tokens() {
    absl::MutexLock lock(&mu_);
    return tokens_;
  }
  std::string text() {
    absl::MutexLock lock(&mu_);
    return text_;
  }
  int ends() {
    absl::MutexLock lock(&mu_);
    return ends_;
  }
  const TurnResult& result() { return result_; }  // after Wait
  const absl::Status& error() { return error_; }  // after Wait

 private:
  absl::Mutex mu_;
  std::vector<int32_t> tokens_ ABSL_GUARDED_BY(mu_);
  std::string text_ ABSL_GUARDED_BY(mu_);
  int token_events_ ABSL_GUARDED_BY(mu_) = 0;
  int ends_ ABSL_GUARDED_BY(mu_) = 0;
  TurnResult result_;
  absl::Status error_;
  absl::Notification ended_;
};

TurnSpec Spec(const std::string& session, const std::string& text, int max_tokens) {
  TurnSpec spec;
  spec.request.set_session_id(session);
  v1::ChatMessage* m = spec.request.add_messages();
  m->set_role("user");
  m->set_content(text);
  spec.request.mutable_sampling()->set_temperature(0);
  spec.request.mutable_sampling()->set_max_tokens(max_tokens);
  return spec;
}

v1::ChatMessage Message(const std::string& role, const std::string& content) {
  v1::ChatMessage m;
  m.set_role(role);
  m.set_content(content);
  return m;
}

// Runs the turn to its end; returns whether it ended in time.
bool RunTurn(WorkerRegistry& registry, metrics::Registry& metrics, TurnSpec spec, FakeSink& sink,
             std::shared_ptr<TurnRunner>* runner_out = nullptr) {
  std::shared_ptr<TurnRunner> runner =
      TurnRunner::Create(registry, metrics, TurnRunnerOptions(), std::move(spec), &sink);
  if (runner_out != nullptr) *runner_out = runner;
  runner->Start();
  return sink.Wait();
}

// Seconds until `worker` reports no active or queued turn, polling its load back to back;
// -1 if that takes longer than `limit`.
double SecondsUntilIdle(Worker& worker, absl::Duration limit) {
  const absl::Time start = absl::Now();
  while (absl::Now() - start < limit) {
    const v1::LoadReport load = worker.Load();
    if (load.active_turns() == 0 && load.queued_turns() == 0) {
      return absl::ToDoubleSeconds(absl::Now() - start);
    }
  }
  return -1;
}

class TurnRunnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    RECALL_REQUIRE_SHARED_FILE(kModel);
    for (Worker& w : workers_) {
      std::string error;
      ASSERT_TRUE(w.Start({"--kv-cache-bytes", "16M"}, &error)) << error;
    }
    // Health comes from the poll in Add only: the heartbeat never runs during a test, so a
    // killed worker still looks healthy and the runner finds out by calling it.
    registry_ = std::make_unique<WorkerRegistry>(nullptr, absl::Hours(1));
    for (Worker& w : workers_) registry_->Add(w.address());
  }

  bool Healthy(const std::string& address) {
    for (const WorkerView& w : registry_->Snapshot()) {
      if (w.address == address) return w.healthy;
    }
    return false;
  }

  Worker workers_[2];
  metrics::Registry metrics_;
  std::unique_ptr<WorkerRegistry> registry_;
};

TEST_F(TurnRunnerTest, EveryTokenReachesTheSinkOnceInOrderThenTheDone) {
  const TurnSpec spec = Spec("plain", "Once upon a time", 20);
  FakeSink sink;
  ASSERT_TRUE(RunTurn(*registry_, metrics_, spec, sink));
  ASSERT_TRUE(sink.error().ok()) << sink.error();
  const TurnResult& result = sink.result();
  EXPECT_EQ(sink.ends(), 1);
  ASSERT_FALSE(result.tokens.empty());
  EXPECT_EQ(sink.tokens(), result.tokens);
  EXPECT_EQ(sink.text(), result.text);
  EXPECT_EQ(result.done.usage().generated_tokens(), static_cast<int>(result.tokens.size()));
  EXPECT_EQ(result.failovers, 0);
  const int served = result.worker == workers_[0].address() ? 0 : 1;
  EXPECT_EQ(result.worker, workers_[served].address());
  // The same request straight to the other worker: the same reply (greedy).
  v1::RunTurnRequest direct = spec.request;
  direct.set_session_id("plain-direct");
  const auto alone = workers_[1 - served].Run(direct);
  ASSERT_TRUE(alone.status.ok()) << alone.status.error_message();
  EXPECT_EQ(alone.tokens, result.tokens);
  EXPECT_EQ(alone.text, result.text);
}

TEST_F(TurnRunnerTest, AWorkerWithoutTheSessionGetsTheTranscriptOnce) {
  // Bound to worker 0, which never saw the session: the first call carries no history, the
  // worker answers HistoryNeeded, and the runner sends the turn again with the transcript.
  TurnSpec spec = Spec("resumed", "What happened next?", 10);
  spec.bound = workers_[0].address();
  spec.history = {Message("user", "Once upon a time"), Message("assistant", " there was a cat.")};
  spec.request.set_history_length(2);
  FakeSink sink;
  ASSERT_TRUE(RunTurn(*registry_, metrics_, spec, sink));
  ASSERT_TRUE(sink.error().ok()) << sink.error();
  EXPECT_EQ(sink.result().worker, workers_[0].address()) << "sticky to the bound worker";
  EXPECT_TRUE(sink.result().done.rebuilt());
  EXPECT_EQ(sink.result().failovers, 0);
  const std::string sticky = "worker=\"" + workers_[0].address() + "\",kind=\"sticky\"";
  EXPECT_EQ(metrics_.GetCounter("recall_coordinator_routes_total", "", sticky)->value(), 2)
      << "one call without the history, one with it";
  EXPECT_TRUE(Healthy(workers_[0].address())) << "asking for history is not a failure";
}

TEST_F(TurnRunnerTest, AHistoryReadLateIsReadOnceWhenAWorkerNeedsItAndItsErrorEndsTheTurn) {
  // The history is not in the spec: the runner reads it (on another thread, as the
  // coordinator's store pool does) when the bound worker answers HistoryNeeded.
  std::atomic<int> reads{0};
  const auto spec_with = [&](const std::string& id, absl::Status error) {
    TurnSpec spec = Spec(id, "What happened next?", 10);
    spec.bound = workers_[0].address();
    spec.request.set_history_length(2);
    spec.fetch_history = [&reads, error](HistoryCallback done) {
      ++reads;
      std::thread([done = std::move(done), error] {
        if (!error.ok()) {
          done(error);
          return;
        }
        done(std::vector<v1::ChatMessage>{Message("user", "Once upon a time"),
                                          Message("assistant", " there was a cat.")});
      }).detach();
    };
    return spec;
  };
  FakeSink sink;
  ASSERT_TRUE(RunTurn(*registry_, metrics_, spec_with("late", absl::OkStatus()), sink));
  ASSERT_TRUE(sink.error().ok()) << sink.error();
  EXPECT_TRUE(sink.result().done.rebuilt());
  EXPECT_EQ(reads.load(), 1);
  // The worker holds the session now: the next turn reads no history.
  TurnSpec next = spec_with("late", absl::OkStatus());
  next.request.set_history_length(4);  // the two above, the first turn's message and reply
  next.request.mutable_messages(0)->set_content("And then?");
  FakeSink second;
  ASSERT_TRUE(RunTurn(*registry_, metrics_, next, second));
  ASSERT_TRUE(second.error().ok()) << second.error();
  EXPECT_FALSE(second.result().done.rebuilt());
  EXPECT_EQ(reads.load(), 1) << "a worker that holds the session needs no history";
  // A history read whole is the truth where the count the turn began with is off (a store's
  // index behind an older coordinator's writes): the worker gets the read's length.
  TurnSpec off = spec_with("off", absl::OkStatus());
  off.request.set_history_length(7);
  FakeSink off_sink;
  ASSERT_TRUE(RunTurn(*registry_, metrics_, off, off_sink));
  ASSERT_TRUE(off_sink.error().ok()) << off_sink.error();
  EXPECT_TRUE(off_sink.result().done.rebuilt());
  // A read that fails ends the turn with its error, named.
  FakeSink failed;
  ASSERT_TRUE(RunTurn(*registry_, metrics_,
                      spec_with("unread", absl::UnavailableError("store down")), failed));
  EXPECT_EQ(failed.error().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(failed.error().message().find("store down"), std::string::npos) << failed.error();
  EXPECT_EQ(failed.ends(), 1);
}

TEST_F(TurnRunnerTest, AWorkerThatIsGoneIsFailedOverAndMarkedDown) {
  FakeSink reference;
  ASSERT_TRUE(RunTurn(*registry_, metrics_, Spec("ref", "Once upon a time", 16), reference));
  ASSERT_TRUE(reference.error().ok()) << reference.error();

  workers_[0].Kill();
  TurnSpec spec = Spec("orphan", "Once upon a time", 16);
  spec.bound = workers_[0].address();  // still healthy as far as the registry knows
  FakeSink sink;
  ASSERT_TRUE(RunTurn(*registry_, metrics_, spec, sink));
  ASSERT_TRUE(sink.error().ok()) << sink.error();
  EXPECT_EQ(sink.result().worker, workers_[1].address());
  EXPECT_EQ(sink.result().failovers, 1);
  EXPECT_EQ(sink.tokens(), reference.tokens());
  EXPECT_FALSE(Healthy(workers_[0].address()));
  EXPECT_EQ(metrics_.GetCounter("recall_coordinator_failovers_total", "")->value(), 1);
}

// A worker marked down holds nothing in the per-worker gauges: its last report stayed (a
// black-box run saw a dead worker's sessions, failed over since, counted on it too).
TEST_F(TurnRunnerTest, ADownWorkersGaugesSayItHoldsNothing) {
  metrics::Registry metrics;
  WorkerRegistry registry(&metrics, absl::Hours(1));
  registry.Add(workers_[0].address());
  FakeSink sink;
  ASSERT_TRUE(RunTurn(registry, metrics_, Spec("held", "Once upon a time", 4), sink));
  ASSERT_TRUE(sink.error().ok()) << sink.error();
  registry.PollAll();
  const std::string sessions =
      "recall_coordinator_worker_sessions{worker=\"" + workers_[0].address() + "\"} ";
  EXPECT_NE(metrics.Render().find(sessions + "1\n"), std::string::npos) << metrics.Render();
  workers_[0].Kill();
  for (int i = 0; i < 3; ++i) registry.PollAll();  // three misses: down
  ASSERT_FALSE(registry.Snapshot()[0].healthy);
  EXPECT_NE(metrics.Render().find(sessions + "0\n"), std::string::npos) << metrics.Render();
}

TEST_F(TurnRunnerTest, ABadRequestIsTheWorkersAnswerAndIsNotRetried) {
  FakeSink sink;
  ASSERT_TRUE(RunTurn(*registry_, metrics_, Spec("bad", "Once upon a time", 0), sink));
  EXPECT_EQ(sink.error().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(sink.error().message().find("max_tokens"), std::string::npos) << sink.error();
  EXPECT_TRUE(sink.tokens().empty());
  EXPECT_TRUE(Healthy(workers_[0].address()));
  EXPECT_TRUE(Healthy(workers_[1].address()));
  EXPECT_EQ(metrics_.GetCounter("recall_coordinator_failovers_total", "")->value(), 0);
}

TEST_F(TurnRunnerTest, AOneTurnSessionIsDroppedBeforeItsDone) {
  TurnSpec spec = Spec("once", "Once upon a time", 8);
  spec.drop_after = true;
  FakeSink sink;
  ASSERT_TRUE(RunTurn(*registry_, metrics_, spec, sink));
  ASSERT_TRUE(sink.error().ok()) << sink.error();
  Worker& served = sink.result().worker == workers_[0].address() ? workers_[0] : workers_[1];
  grpc::ClientContext ctx;
  v1::DropSessionRequest drop;
  drop.set_session_id("once");
  v1::DropSessionResponse resp;
  EXPECT_EQ(served.stub().DropSession(&ctx, drop, &resp).error_code(), grpc::StatusCode::NOT_FOUND)
      << "the runner dropped it already";
}

TEST_F(TurnRunnerTest, CancelEndsTheTurnAndTheWorkersTurnPromptly) {
  FakeSink sink;
  std::shared_ptr<TurnRunner> runner = TurnRunner::Create(
      *registry_, metrics_, TurnRunnerOptions(), Spec("cancelled", "Once upon a time", 400), &sink);
  absl::Time cancelled_at;
  sink.on_first_tokens = [&] {
    cancelled_at = absl::Now();
    runner->Cancel();  // from inside a sink call
  };
  runner->Start();
  ASSERT_TRUE(sink.Wait());
  EXPECT_EQ(sink.error().code(), absl::StatusCode::kCancelled) << sink.error();
  for (Worker& w : workers_) {
    ASSERT_GE(SecondsUntilIdle(w, absl::Seconds(5)), 0) << w.address() << " still runs the turn";
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - cancelled_at);
  RecordProperty("seconds_from_cancel_to_idle_workers", std::to_string(seconds));
  EXPECT_LT(seconds, 2.0);
  runner->Cancel();  // again, after the end: nothing more is reported
  EXPECT_EQ(sink.ends(), 1);
}

TEST(TurnRunnerNoWorkerTest, NoWorkerIsUnavailableAndRetryable) {
  WorkerRegistry registry(nullptr, absl::Hours(1));
  metrics::Registry metrics;
  FakeSink sink;
  ASSERT_TRUE(RunTurn(registry, metrics, Spec("none", "hi", 4), sink));
  EXPECT_EQ(sink.error().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(sink.error().message().find("no worker is registered"), std::string::npos)
      << sink.error();
  EXPECT_NE(sink.error().message().find("retryable"), std::string::npos);
}

// Workers known but not answering: said so, not "no worker is registered".
TEST(TurnRunnerNoWorkerTest, KnownWorkersThatDoNotAnswerAreSaidNotToAnswer) {
  WorkerRegistry registry(nullptr, absl::Hours(1));
  registry.Add("127.0.0.1:1");
  metrics::Registry metrics;
  FakeSink sink;
  ASSERT_TRUE(RunTurn(registry, metrics, Spec("none", "hi", 4), sink));
  EXPECT_EQ(sink.error().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(sink.error().message().find("the 1 worker(s) serving it are not answering"),
            std::string::npos)
      << sink.error();
}

TEST(TurnRunnerSmallPoolTest, ATurnNoPoolCanHoldIsResourceExhaustedBeforeAnyToken) {
  RECALL_REQUIRE_SHARED_FILE(kModel);
  Worker small;  // 40 blocks of 16 tokens: 128 tokens in each of stories260K's 5 layers
  std::string error;
  ASSERT_TRUE(small.Start({"--kv-cache-bytes", "80K", "--kv-dtype", "bf16"}, &error)) << error;
  WorkerRegistry registry(nullptr, absl::Hours(1));
  registry.Add(small.address());
  metrics::Registry metrics;
  FakeSink sink;
  ASSERT_TRUE(RunTurn(registry, metrics, Spec("big", "Once upon a time", 400), sink));
  EXPECT_EQ(sink.error().code(), absl::StatusCode::kResourceExhausted) << sink.error();
  EXPECT_NE(sink.error().message().find("not retryable"), std::string::npos) << sink.error();
  EXPECT_TRUE(sink.tokens().empty());
  // The worker is not marked down, and a turn that fits runs on it.
  FakeSink fits;
  ASSERT_TRUE(RunTurn(registry, metrics, Spec("small", "Once upon a time", 60), fits));
  EXPECT_TRUE(fits.error().ok()) << fits.error();
  EXPECT_FALSE(fits.tokens().empty());
}

// Workers with random weights of SmolLM2-135M's shape: tens of ms per token on the CPU, so a
// turn lasts long enough to be interrupted, or to keep a worker busy.
class SlowWorkersTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = testing::SharedPath("tokenizers/smollm2");
    if (!std::filesystem::exists(model_ + "/config.json")) {
      GTEST_SKIP() << "shared data missing: " << model_;
    }
  }

  // Starts worker i with `extra` flags and adds it to the registry.
  void StartWorker(int i, std::vector<std::string> extra = {}) {
    std::vector<std::string> args = {"--model", model_, "--random-weights", "--kv-cache-bytes",
                                     "64M"};
    args.insert(args.end(), extra.begin(), extra.end());
    std::string error;
    ASSERT_TRUE(workers_[i].StartWith(args, &error)) << error;
    registry_.Add(workers_[i].address());
  }

  // A turn of session `id`, bound to worker 0, is run by worker 1 without a failed attempt.
  void ExpectABoundTurnGoesToWorker1(const std::string& id, const std::string& why) {
    TurnSpec spec = Spec(id, "Once upon a time", 4);
    spec.bound = workers_[0].address();
    FakeSink sink;
    ASSERT_TRUE(RunTurn(registry_, metrics_, spec, sink));
    ASSERT_TRUE(sink.error().ok()) << sink.error();
    EXPECT_EQ(sink.result().worker, workers_[1].address());
    EXPECT_EQ(sink.result().failovers, 0) << why;
    EXPECT_EQ(metrics_.GetCounter("recall_coordinator_failovers_total", "")->value(), 0);
  }

  std::string model_;
  Worker workers_[2];
  WorkerRegistry registry_{nullptr, absl::Hours(1)};
  metrics::Registry metrics_;
};

TEST_F(SlowWorkersTest, AWorkerKilledMidReplyIsResumedElsewhereWithNothingLost) {
  StartWorker(0);
  StartWorker(1);
  FakeSink reference;
  ASSERT_TRUE(RunTurn(registry_, metrics_, Spec("reference", "Once upon a time", 40), reference));
  ASSERT_TRUE(reference.error().ok()) << reference.error();
  ASSERT_GT(reference.tokens().size(), 20u);

  FakeSink sink;
  int killed = -1;
  sink.on_first_tokens = [&] {
    // A worker's load shows the turn from the end of the step that sent its first token.
    const absl::Time deadline = absl::Now() + absl::Seconds(5);
    while (absl::Now() < deadline) {
      for (int i = 0; i < 2; ++i) {
        if (workers_[i].Load().active_turns() > 0) {
          killed = i;
          workers_[i].Kill();  // SIGKILL, mid-stream
          return;
        }
      }
    }
  };
  ASSERT_TRUE(RunTurn(registry_, metrics_, Spec("killed", "Once upon a time", 40), sink));
  ASSERT_GE(killed, 0) << "no worker was running the turn";
  ASSERT_TRUE(sink.error().ok()) << sink.error();
  EXPECT_EQ(sink.result().failovers, 1);
  EXPECT_EQ(sink.result().worker, workers_[1 - killed].address());
  EXPECT_EQ(sink.tokens(), reference.tokens()) << "no token lost or repeated";
  EXPECT_EQ(sink.text(), reference.text());
  EXPECT_EQ(sink.result().tokens, reference.tokens());
}

// A stopping worker (SIGTERM) lets its running turn end and takes no new one: its load says
// so, and the runner sends it none, not even its own session's, which goes to the other worker
// without a failed attempt (it was sent there, refused as "shutting down", and counted as a
// worker failure that marked it down).
TEST_F(SlowWorkersTest, AStoppingWorkerGetsNoTurnItsRunningOneEnds) {
  StartWorker(0);
  StartWorker(1);
  grpc::ClientContext running_ctx;
  auto running = workers_[0].stub().RunTurn(&running_ctx, Turn("running", "Once upon a time", 60));
  v1::TurnEvent ev;
  ASSERT_TRUE(running->Read(&ev)) << "the first turn is generating";
  workers_[0].Terminate();
  v1::LoadReport load;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline && !load.stopping()) load = workers_[0].Load();
  ASSERT_TRUE(load.stopping());
  registry_.PollAll();

  ASSERT_NO_FATAL_FAILURE(
      ExpectABoundTurnGoesToWorker1("bound", "a stopping worker is not a failed one"));

  int tokens = 0;
  while (running->Read(&ev)) tokens += ev.tokens().token_ids_size();
  EXPECT_TRUE(running->Finish().ok()) << "the running turn ended whole";
  EXPECT_GT(tokens, 40);
}

TEST_F(SlowWorkersTest, AFullWorkerIsPassedOverForAnotherAndStaysUp) {
  // Worker 0 runs one turn at a time and queues one more; with both taken, a third turn
  // bound to it gets RESOURCE_EXHAUSTED and the runner takes it to worker 1: not a failover.
  StartWorker(0, {"--max-active", "1", "--max-queued", "1"});
  StartWorker(1);
  grpc::ClientContext running_ctx, queued_ctx;
  auto running = workers_[0].stub().RunTurn(&running_ctx, Turn("running", "Once upon a time", 400));
  v1::TurnEvent ev;
  ASSERT_TRUE(running->Read(&ev)) << "the first turn is generating";
  auto queued = workers_[0].stub().RunTurn(&queued_ctx, Turn("queued", "Once upon a time", 400));
  v1::LoadReport load;
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (absl::Now() < deadline && load.queued_turns() < 1) load = workers_[0].Load();
  ASSERT_EQ(load.queued_turns(), 1) << "the second turn waits";

  ASSERT_NO_FATAL_FAILURE(
      ExpectABoundTurnGoesToWorker1("third", "a full worker is not a failed one"));
  for (const WorkerView& w : registry_.Snapshot()) EXPECT_TRUE(w.healthy) << w.address;

  running_ctx.TryCancel();
  queued_ctx.TryCancel();
  while (running->Read(&ev)) {
  }
  while (queued->Read(&ev)) {
  }
  running->Finish();
  queued->Finish();
}

}  // namespace
}  // namespace recall::coordinator
