// The C++ SDK against `recall serve`-like processes (a coordinator and a worker): callback
// and iterator forms of a turn give the same reply, History, Close, and errors as statuses;
// a turn whose coordinator is killed mid-reply is sent again under its turn id and resumed,
// not run twice, in both forms.
#include <signal.h>
#include <sys/wait.h>

#include <optional>
#include <thread>

#include "client/client.h"
#include "common/subprocess.h"
#include "gtest/gtest.h"
#include "tests/common/redis_server.h"
#include "tests/common/test_util.h"
#include "tests/integration/http_get.h"
#include "tests/integration/serve_processes.h"

namespace recall {
namespace {

constexpr char kModel[] = "models/stories260K/stories260K.bin";

// Starts `coordinator` on `address` and `dir`, routing to `worker`, after `delay`, on a thread
// of its own (joined by the caller).
std::thread StartCoordinatorAfter(std::chrono::milliseconds delay, ServerProcess& coordinator,
                                  const ServerProcess& worker, const std::string& address,
                                  const std::string& dir) {
  return std::thread([&coordinator, &worker, address, dir, delay] {
    std::this_thread::sleep_for(delay);
    std::string err;
    EXPECT_TRUE(coordinator.Start(RECALL_COORDINATOR_BINARY,
                                  {"--workers", "127.0.0.1:" + std::to_string(worker.port("grpc")),
                                   "--listen", address, "--data-dir", dir},
                                  dir, &err))
        << err;
  });
}

TEST(ClientSdkTest, CallbackAndIteratorRepliesHistoryAndClose) {
  RECALL_REQUIRE_SHARED_FILE(kModel);
  const std::string dir = testing::MakeTempDir("sdk");
  ServerProcess worker, coordinator;
  std::string error;
  const std::string address = testing::StartServe(dir, worker, coordinator, &error);
  ASSERT_FALSE(address.empty()) << error;
  auto client = Client::Connect({.address = address});
  auto a = client->StartSession({});
  auto b = client->StartSession({});
  ASSERT_TRUE(a.ok() && b.ok());
  for (auto* s : {&*a, &*b}) {
    (*s)->sampling().set_temperature(0);
    (*s)->sampling().set_max_tokens(30);
  }
  std::string by_callback;
  auto done = (*a)->Send("Once upon a time", [&](const std::string& t) { by_callback += t; });
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_GT(done->usage().generated_tokens(), 0);

  auto reply = (*b)->Stream("Once upon a time");
  std::string by_iterator, piece;
  while (reply->Next(&piece)) by_iterator += piece;
  ASSERT_TRUE(reply->status().ok()) << reply->status();
  EXPECT_EQ(by_iterator, by_callback);
  EXPECT_EQ(reply->done().usage().generated_tokens(), done->usage().generated_tokens());

  auto history = (*a)->History();
  ASSERT_TRUE(history.ok());
  ASSERT_EQ(history->size(), 2u);
  EXPECT_EQ((*history)[1].content(), by_callback);
  EXPECT_NE(done->finish_reason(), v1::FINISH_REASON_UNSPECIFIED);
  EXPECT_EQ((*history)[1].finish_reason(), done->finish_reason()) << "how the reply ended";
  ASSERT_TRUE((*a)->Close().ok());
  EXPECT_EQ((*a)->History().status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client->Converse("s-missing", "hi", {}, nullptr).status().code(),
            absl::StatusCode::kNotFound);
}

// CreateSession, which is not retried (a lost reply would leave a session behind), waits for
// a server that is starting, as long as the other calls' retries would; with none there, the
// error names the address and what should run there.
TEST(ClientSdkTest, ASessionAskedForBeforeItsServerListensIsMadeOnceItDoes) {
  RECALL_REQUIRE_SHARED_FILE(kModel);
  const std::string dir = testing::MakeTempDir("sdk_early");
  const std::string address = "127.0.0.1:" + std::to_string(testing::FreePort());
  auto lonely = Client::Connect({.address = address, .retries = 2});  // waits 0.3 s
  const absl::StatusOr<v1::Session> refused = lonely->CreateSession({});
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(
      refused.status().message().find("cannot reach " + address +
                                      " (is recall serve or recall-coordinator running there?"),
      std::string::npos)
      << refused.status();

  ServerProcess worker, coordinator;
  std::string error;
  ASSERT_TRUE(worker.Start(RECALL_WORKER_BINARY,
                           {"--model", testing::SharedPath(kModel), "--tokenizer",
                            testing::SharedPath("models/stories260K/tok512.bin"), "--listen",
                            "127.0.0.1:0", "--kv-cache-bytes", "16M", "--threads", "1"},
                           dir, &error))
      << error;
  std::thread later =
      StartCoordinatorAfter(std::chrono::seconds(1), coordinator, worker, address, dir);
  auto client = Client::Connect({.address = address});
  const absl::StatusOr<v1::Session> made = client->CreateSession({});
  later.join();
  ASSERT_TRUE(made.ok()) << made.status();
  EXPECT_FALSE(made->session_id().empty());
}

// The retries have their whole window (6.3 s) whatever the attempts took: a recall serve
// back 3 s in answers at once, before its worker has joined ("no worker could take the
// turn", retryable), and the turn is taken once the worker is there. The wait that ended when
// serve was back used up the retries, and the turn failed 3.1 s in.
TEST(ClientSdkTest, RetriesHaveTheirWholeWindowWhenTheServerIsBackEarly) {
  RECALL_REQUIRE_SHARED_FILE(kModel);
  const std::string dir = testing::MakeTempDir("sdk_window");
  const std::string address = "127.0.0.1:" + std::to_string(testing::FreePort());
  ServerProcess serve;
  const auto start = [&](std::string* err) {
    return serve.Start(
        RECALL_CLI_BINARY,
        {"serve", "--model", testing::SharedPath(kModel), "--tokenizer",
         testing::SharedPath("models/stories260K/tok512.bin"), "--listen", address, "--http-listen",
         "off", "--data-dir", dir, "--kv-cache-bytes", "16M", "--threads", "1"},
        dir, err);
  };
  std::string error;
  ASSERT_TRUE(start(&error)) << error;
  auto client = Client::Connect({.address = address});
  auto session = client->StartSession({});
  ASSERT_TRUE(session.ok()) << session.status();
  (*session)->sampling().set_max_tokens(4);
  ASSERT_TRUE((*session)->Send("Once upon a time", nullptr).ok());
  serve.Stop();
  std::thread later([&] {
    std::this_thread::sleep_for(std::chrono::seconds(3));
    std::string err;
    EXPECT_TRUE(start(&err)) << err;
  });
  const auto next = (*session)->Send("What happened next?", nullptr);
  later.join();
  ASSERT_TRUE(next.ok()) << next.status();
}

// A turn refused because the worker is full (RESOURCE_EXHAUSTED "retry after N ms": one turn
// runs, none may wait) is sent again after that wait and answered: four sessions at once on a
// worker that runs one turn at a time all get their replies, and the worker did refuse some.
TEST(ClientSdkTest, TurnsRefusedByAFullWorkerAreSentAgainAfterTheWaitItNames) {
  RECALL_REQUIRE_SHARED_FILE(kModel);
  const std::string dir = testing::MakeTempDir("sdk_full");
  ServerProcess serve;
  std::string error;
  ASSERT_TRUE(serve.Start(RECALL_CLI_BINARY,
                          {"serve",
                           "--model",
                           testing::SharedPath(kModel),
                           "--tokenizer",
                           testing::SharedPath("models/stories260K/tok512.bin"),
                           "--listen",
                           "127.0.0.1:0",
                           "--http-listen",
                           "off",
                           "--data-dir",
                           dir,
                           "--kv-cache-bytes",
                           "16M",
                           "--threads",
                           "1",
                           "--max-active",
                           "1",
                           "--max-queued",
                           "0",
                           "--worker-metrics-port",
                           "0"},
                          dir, &error))
      << error;
  const std::string address = "127.0.0.1:" + std::to_string(serve.port("grpc"));
  auto client = Client::Connect({.address = address, .retries = 8});
  ASSERT_NE(serve.port("worker-metrics"), 0);
  double rejected = 0;
  for (int round = 0; round < 5 && rejected == 0; ++round) {
    std::vector<std::thread> turns;
    std::vector<absl::Status> results(4);
    for (int i = 0; i < 4; ++i) {
      turns.emplace_back([&, i] {
        auto session = client->StartSession({});
        if (!session.ok()) {
          results[i] = session.status();
          return;
        }
        (*session)->sampling().set_max_tokens(400);
        (*session)->sampling().set_temperature(0);
        auto done = (*session)->Send("Once upon a time", nullptr);
        results[i] = done.ok() ? absl::OkStatus() : done.status();
      });
    }
    for (std::thread& t : turns) t.join();
    for (const absl::Status& r : results) EXPECT_TRUE(r.ok()) << r;
    const std::string line =
        testing::MetricLine(serve.port("worker-metrics"), "recall_worker_rejected_turns_total");
    ASSERT_FALSE(line.empty());
    rejected = std::stod(line.substr(line.rfind(' ') + 1));
  }
  EXPECT_GT(rejected, 0) << "no turn was ever refused: the test did not run a full worker";
}

// Options no call can be made with are said by every call at once: a key with a space or a
// line end (it was left out, and the server said the key was missing), an empty address (gRPC
// said "Failed to create secure client channel").
TEST(ClientSdkTest, OptionsNoCallCanBeMadeWithAreSaidByEveryCall) {
  auto keyed = Client::Connect({.address = "127.0.0.1:1", .api_key = "key alpha\n"});
  EXPECT_EQ(keyed->ListSessions().status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(keyed->ListSessions().status().message().find("api_key: the key must be printable"),
            std::string::npos);
  EXPECT_EQ(keyed->CreateSession({}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(keyed->Converse("s-x", "hi", {}, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(keyed->Generate({}, nullptr).status().code(), absl::StatusCode::kInvalidArgument);
  auto nowhere = Client::Connect({.address = ""});
  auto stream = nowhere->ConverseStream("s-x", "hi", {});
  std::string piece;
  EXPECT_FALSE(stream->Next(&piece));
  EXPECT_EQ(stream->status().message(), "address: empty; give the coordinator's HOST:PORT");
}

// A Cancel from another thread while a reply waits to be asked again (its server is down)
// ends the wait: it went on to the end of the backoff (up to seconds).
TEST(ClientSdkTest, ACancelEndsTheWaitBeforeARetry) {
  const std::string address = "127.0.0.1:" + std::to_string(testing::FreePort());
  auto client = Client::Connect({.address = address, .retries = 8});
  auto reply = client->ConverseStream("s-x", "hi", {});
  std::chrono::steady_clock::time_point cancelled;
  std::thread later([&] {
    std::this_thread::sleep_for(std::chrono::seconds(2));  // in the 1.6 s wait (1.5 s to 3.1 s)
    cancelled = std::chrono::steady_clock::now();
    reply->Cancel();
  });
  std::string piece;
  EXPECT_FALSE(reply->Next(&piece));
  const auto ended = std::chrono::steady_clock::now();
  later.join();
  const double after = std::chrono::duration<double>(ended - cancelled).count();
  EXPECT_EQ(reply->status().code(), absl::StatusCode::kCancelled) << reply->status();
  EXPECT_LT(after, 0.5) << "the wait went on after the cancel";
}

// A long session's transcript passes gRPC's default 4 MiB message limit: the SDK takes it
// (recall sessions show and recall chat --session failed on it).
TEST(ClientSdkTest, ATranscriptOverFourMebibytesIsRead) {
  RECALL_REQUIRE_SHARED_FILE(kModel);
  if (testing::RunToExit("command -v sqlite3").code != 0) GTEST_SKIP() << "no sqlite3 CLI";
  const std::string dir = testing::MakeTempDir("sdk_big");
  ServerProcess worker, coordinator;
  std::string error;
  const std::string address = testing::StartServe(dir, worker, coordinator, &error);
  ASSERT_FALSE(address.empty()) << error;
  auto client = Client::Connect({.address = address});
  const absl::StatusOr<v1::Session> made = client->CreateSession({});
  ASSERT_TRUE(made.ok()) << made.status();
  // 5.2 MB of text in one message (written by hand: a transcript grown over many turns).
  const testing::Exit wrote = testing::RunToExit(
      "sqlite3 " + dir + "/sessions.db \"INSERT INTO messages(session_id, idx, role, content) " +
      "VALUES ('" + made->session_id() + "', 0, 'user', CAST(hex(zeroblob(2600000)) AS BLOB));\"");
  ASSERT_EQ(wrote.code, 0) << wrote.output;
  const absl::StatusOr<v1::Session> read = client->GetSession(made->session_id());
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->messages_size(), 1);
  EXPECT_EQ(read->messages(0).content().size(), 5200000u);
}

// A coordinator down for a while (gRPC's reconnect backoff has grown to seconds) is started
// again 1.5 s after the next message is sent: the turn reaches it within the retries (5:
// 3.1 s). The channel was dialled again only at the end of its own backoff, after the
// retries had given up (a piped recall chat lost its next lines so). With none back, the
// error names the address and what should run there.
TEST(ClientSdkTest, ACoordinatorBackFromARestartIsReachedWithinTheRetries) {
  RECALL_REQUIRE_SHARED_FILE(kModel);
  const std::string dir = testing::MakeTempDir("sdk_back");
  ServerProcess worker, coordinator;
  std::string error;
  const std::string address = testing::StartServe(dir, worker, coordinator, &error);
  ASSERT_FALSE(address.empty()) << error;
  auto client = Client::Connect({.address = address, .retries = 5});
  auto session = client->StartSession({});
  ASSERT_TRUE(session.ok()) << session.status();
  (*session)->sampling().set_max_tokens(4);
  ASSERT_TRUE((*session)->Send("Once upon a time", nullptr).ok());
  coordinator.Kill();
  std::this_thread::sleep_for(std::chrono::seconds(5));
  std::thread later =
      StartCoordinatorAfter(std::chrono::milliseconds(1500), coordinator, worker, address, dir);
  const auto next = (*session)->Send("What happened next?", nullptr);
  later.join();
  ASSERT_TRUE(next.ok()) << next.status();
  auto history = (*session)->History();
  ASSERT_TRUE(history.ok()) << history.status();
  EXPECT_EQ(history->size(), 4u);

  coordinator.Kill();
  const auto lost = (*session)->Send("And then?", nullptr);
  EXPECT_EQ(lost.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(lost.status().message().find("cannot reach " + address), std::string::npos)
      << lost.status();
}

// A reply stopped by the client (Cancel) and the session's next message sent at once: the
// client sees its cancel before the coordinator does, which may refuse the next turn as "a
// turn of this session is running" (retryable); the SDK asks again, so the message is taken.
// Repeated, since it is a race.
TEST(ClientSdkTest, TheNextMessageRightAfterACancelIsTaken) {
  RECALL_REQUIRE_SHARED_FILE(kModel);
  const std::string dir = testing::MakeTempDir("sdk_cancel_next");
  ServerProcess worker, coordinator;
  std::string error;
  const std::string address = testing::StartServe(dir, worker, coordinator, &error);
  ASSERT_FALSE(address.empty()) << error;
  auto client = Client::Connect({.address = address});
  auto session = client->StartSession({});
  ASSERT_TRUE(session.ok()) << session.status();
  (*session)->sampling().set_temperature(0);
  (*session)->sampling().set_max_tokens(200);
  for (int round = 0; round < 12; ++round) {
    SCOPED_TRACE(round);
    auto reply = (*session)->Stream("Once upon a time");
    std::string piece;
    ASSERT_TRUE(reply->Next(&piece)) << reply->status();
    reply->Cancel();
    while (reply->Next(&piece)) {
    }
    (*session)->sampling().set_max_tokens(2);
    auto next = (*session)->Send("Once upon a time", nullptr);
    ASSERT_TRUE(next.ok()) << next.status();
    (*session)->sampling().set_max_tokens(200);
  }
}

// A second SIGTERM to a coordinator letting a reply end (the first one) ends it at once: the
// reply streamed on for gRPC's 5 s shutdown grace. The client hears UNAVAILABLE (its retries
// would resume the turn on another replica or after the restart) and the coordinator exits.
TEST(ClientSdkTest, ASecondStopSignalEndsARunningReplyAtOnce) {
  RECALL_REQUIRE_SHARED_FILE("tokenizers/smollm2/config.json");
  const std::string dir = testing::MakeTempDir("sdk_second_signal");
  ServerProcess worker, coordinator;
  std::string error;
  const std::string address =
      testing::StartServe(dir, worker, coordinator, &error, testing::SlowModelFlags());
  ASSERT_FALSE(address.empty()) << error;
  auto client = Client::Connect({.address = address, .retries = 0});
  auto session = client->StartSession({});
  ASSERT_TRUE(session.ok()) << session.status();
  (*session)->sampling().set_max_tokens(1000);
  (*session)->sampling().set_temperature(1);
  auto reply = (*session)->Stream("Tell me a long story");
  std::string piece;
  ASSERT_TRUE(reply->Next(&piece)) << reply->status();
  kill(coordinator.pid(), SIGTERM);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  kill(coordinator.pid(), SIGTERM);
  const auto second = std::chrono::steady_clock::now();
  while (reply->Next(&piece)) {
  }
  const double ended =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - second).count();
  EXPECT_EQ(reply->status().code(), absl::StatusCode::kUnavailable) << reply->status();
  EXPECT_LT(ended, 3.0) << "the reply went on after the second signal";
  std::optional<int> exit;
  for (int i = 0; i < 300 && !exit.has_value(); ++i) {
    exit = coordinator.Reap();
    if (!exit.has_value()) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(exit.has_value()) << "still running 3 s after the reply ended";
  EXPECT_TRUE(WIFEXITED(*exit) && WEXITSTATUS(*exit) == 0) << *exit;
}

// Turns cancelled one after another just after they were sent (2 ms): each next one waited on
// the coordinator, holding one of its store threads, for the end of the cancelled one, whose
// end was queued behind them on those threads; the session's next message waited 20 s (two
// rounds of the 10 s bound). A hang, so bounded loosely: it now takes about a second.
// On a slow model (random weights of SmolLM2's shape), whose turns are still running when
// their cancels come.
TEST(ClientSdkTest, TurnsCancelledInARowDoNotHoldTheNextOne) {
  RECALL_REQUIRE_SHARED_FILE("tokenizers/smollm2/config.json");
  const std::string dir = testing::MakeTempDir("sdk_cancel_row");
  ServerProcess worker, coordinator;
  std::string error;
  const std::string address =
      testing::StartServe(dir, worker, coordinator, &error, testing::SlowModelFlags());
  ASSERT_FALSE(address.empty()) << error;
  auto client = Client::Connect({.address = address});
  auto session = client->StartSession({});
  ASSERT_TRUE(session.ok()) << session.status();
  (*session)->sampling().set_max_tokens(3);
  for (int k = 0; k < 10; ++k) {
    auto reply = (*session)->Stream("Once upon a time " + std::to_string(k));
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    reply->Cancel();
    std::string piece;
    while (reply->Next(&piece)) {
    }
  }
  const auto start = std::chrono::steady_clock::now();
  const auto next = (*session)->Send("And then?", nullptr);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_LT(seconds, 8.0) << "the next turn waited for the cancelled ones' ends";
}

// The coordinator is killed (SIGKILL) after the reply's first text and started again on the
// same port and store: the SDK asks again under the same turn id (Send and the iterator form
// alike); the new coordinator has the turn interrupted (as every turn left in progress by a
// dead coordinator) and resumes it, so the reply is whole, the same text as the turn without
// the fault, passed on once, in order, with no second user message stored.
class ClientSdkRetryTest : public ::testing::TestWithParam<bool> {};

TEST_P(ClientSdkRetryTest, ATurnWhoseCoordinatorDiedIsResumedNotSentTwice) {
  const bool iterator = GetParam();
  RECALL_REQUIRE_SHARED_FILE(kModel);
  const std::string dir = testing::MakeTempDir("sdk_retry");
  ServerProcess worker, coordinator;
  std::string error;
  const std::string address = testing::StartServe(dir, worker, coordinator, &error);
  ASSERT_FALSE(address.empty()) << error;
  const std::string port = address.substr(address.rfind(':') + 1);
  auto client = Client::Connect({.address = address, .retries = 8});
  auto reference = client->StartSession({});
  ASSERT_TRUE(reference.ok()) << reference.status();
  (*reference)->sampling().set_temperature(0);
  (*reference)->sampling().set_max_tokens(200);
  std::string whole;
  ASSERT_TRUE(
      (*reference)->Send("Once upon a time", [&](const std::string& t) { whole += t; }).ok());
  auto session = client->StartSession({});
  ASSERT_TRUE(session.ok()) << session.status();
  (*session)->sampling().set_temperature(0);
  (*session)->sampling().set_max_tokens(200);
  std::string text;
  bool restarted = false;
  const auto on_text = [&](const std::string& t) {
    text += t;
    if (restarted) return;
    restarted = true;
    coordinator.Kill();
    std::string err;
    ASSERT_TRUE(coordinator.Start(RECALL_COORDINATOR_BINARY,
                                  {"--workers", "127.0.0.1:" + std::to_string(worker.port("grpc")),
                                   "--listen", "127.0.0.1:" + port, "--data-dir", dir},
                                  dir, &err))
        << err;
  };
  v1::ConverseDone done;
  if (iterator) {
    auto reply = (*session)->Stream("Once upon a time");
    std::string piece;
    while (reply->Next(&piece)) on_text(piece);
    ASSERT_TRUE(reply->status().ok()) << reply->status();
    done = reply->done();
  } else {
    auto sent = (*session)->Send("Once upon a time", on_text);
    ASSERT_TRUE(sent.ok()) << sent.status();
    done = *sent;
  }
  ASSERT_TRUE(restarted) << "no text arrived";
  EXPECT_TRUE(done.resumed());
  auto history = (*session)->History();
  ASSERT_TRUE(history.ok()) << history.status();
  ASSERT_EQ(history->size(), 2u) << "one user message and its reply";
  EXPECT_EQ((*history)[0].content(), "Once upon a time");
  EXPECT_EQ((*history)[0].turn_id().rfind("sdk-", 0), 0u) << (*history)[0].turn_id();
  EXPECT_EQ((*history)[1].state(), v1::TURN_STATE_COMPLETE);
  EXPECT_EQ(text, (*history)[1].content()) << "every piece once, in order";
  EXPECT_EQ(text, whole) << "the reply of the same turn without the fault";
  // The session goes on.
  auto next = (*session)->Send("What happened next?", nullptr);
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_FALSE(next->replayed());
}

INSTANTIATE_TEST_SUITE_P(CallbackAndIterator, ClientSdkRetryTest, ::testing::Bool(),
                         [](const auto& info) { return info.param ? "Stream" : "Send"; });

}  // namespace
}  // namespace recall
