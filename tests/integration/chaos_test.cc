// Chaos: recall-coordinator (SQLite) and three recall-worker processes (stories260K) over
// loopback gRPC; six sessions of three greedy turns each (three with a stop string), run by six
// clients at once, while a seeded schedule SIGKILLs workers (each restarted on its port) and,
// once, the coordinator (restarted on its port over the same data directory), each kill while
// replies stream.
//
// A client does what a careful one does: when a turn's call fails, it looks at the stored
// session (a turn whose reply was stored complete before the call broke counts as answered)
// and otherwise sends the message again. Checked against the same turns run first with no
// fault:
//   - no turn lost: every turn gets a reply, within the time limit;
//   - no duplicated or missing token: each reply's tokens equal the no-fault run's;
//   - transcripts consistent: the complete turns are exactly the six conversations; every
//     other reply is interrupted (or failed), none is left in progress, and an interrupted
//     reply starts with what its client was sent and is a prefix of the no-fault reply.
#include <signal.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/subprocess.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "recall/v1/chat.grpc.pb.h"
#include "recall/v1/worker.grpc.pb.h"
#include "tests/common/test_util.h"

namespace recall {
namespace {

constexpr char kModel[] = "models/stories260K/stories260K.bin";
constexpr char kTokenizer[] = "models/stories260K/tok512.bin";
constexpr int kWorkers = 3, kSessions = 6, kTurns = 3, kMaxTokens = 120;

std::string Message(int session, int turn) {
  static const char* const kNames[kSessions] = {"Lily", "Tom", "Ben", "Sue", "Max", "Amy"};
  static const char* const kTurnsText[kTurns] = {"went to the park", "saw a big dog",
                                                 "and then they"};
  return std::string(kNames[session]) + " " + kTurnsText[turn];
}

// What a client saw of one call.
struct Attempt {
  grpc::Status status;
  std::string text;
  std::vector<int32_t> tokens;
  bool done = false;
  // A broken call whose reply the client then found stored complete (it did not resend).
  bool found_complete = false;
};

class ChaosTest : public ::testing::Test {
 protected:
  void SetUp() override {
    RECALL_REQUIRE_SHARED_FILE(kModel);
    dir_ = testing::MakeTempDir("chaos");
    std::ofstream(dir_ + "/keys") << "key-a tenant-a\n";
    for (int i = 0; i < kWorkers; ++i) ASSERT_TRUE(StartWorker(i, 0));
    ASSERT_TRUE(StartCoordinator(0));
  }

  bool StartWorker(int i, int port) {
    std::string error;
    const bool ok = workers_[i].Start(
        RECALL_WORKER_BINARY,
        {"--model", testing::SharedPath(kModel), "--tokenizer", testing::SharedPath(kTokenizer),
         "--listen", "127.0.0.1:" + std::to_string(port), "--kv-cache-bytes", "16M", "--threads",
         "1"},
        dir_, &error);
    EXPECT_TRUE(ok) << "worker " << i << ": " << error;
    if (ok) worker_ports_[i] = workers_[i].port("grpc");
    return ok;
  }

  bool StartCoordinator(int port) {
    std::string workers;
    for (int i = 0; i < kWorkers; ++i) {
      workers += (i ? "," : "") + std::string("127.0.0.1:") + std::to_string(worker_ports_[i]);
    }
    std::string error;
    const bool ok =
        coordinator_.Start(RECALL_COORDINATOR_BINARY,
                           {"--workers", workers, "--listen", "127.0.0.1:" + std::to_string(port),
                            "--data-dir", dir_, "--api-keys", dir_ + "/keys"},
                           dir_, &error);
    EXPECT_TRUE(ok) << error;
    if (ok) coordinator_port_ = coordinator_.port("grpc");
    return ok;
  }

  std::unique_ptr<v1::Chat::Stub> Stub() {
    return v1::Chat::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(coordinator_port_),
                                                 grpc::InsecureChannelCredentials()));
  }

  static void Auth(grpc::ClientContext* ctx, int seconds = 30) {
    ctx->AddMetadata("authorization", "Bearer key-a");
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(seconds));
  }

  grpc::Status Create(std::string* id) {
    grpc::ClientContext ctx;
    Auth(&ctx);
    v1::CreateSessionRequest req;
    req.set_system_prompt("Tell a story.");
    v1::Session s;
    grpc::Status st = Stub()->CreateSession(&ctx, req, &s);
    *id = s.session_id();
    return st;
  }

  grpc::Status Get(const std::string& id, v1::Session* s) {
    grpc::ClientContext ctx;
    Auth(&ctx);
    v1::GetSessionRequest req;
    req.set_session_id(id);
    return Stub()->GetSession(&ctx, req, s);
  }

  // Session s's turn; every other session's replies end at the first ". " (a stop string: the
  // worker gives back the tokens after the cut, and a rebuild replays that).
  Attempt Say(int s, const std::string& id, const std::string& message) {
    grpc::ClientContext ctx;
    Auth(&ctx);
    v1::ConverseRequest req;
    req.set_session_id(id);
    req.set_message(message);
    req.mutable_sampling()->set_temperature(0);
    req.mutable_sampling()->set_max_tokens(kMaxTokens);
    if (s % 2 == 1) req.mutable_sampling()->add_stop(". ");
    auto reader = Stub()->Converse(&ctx, req);
    Attempt a;
    v1::ConverseEvent ev;
    bool counted = false;
    while (reader->Read(&ev)) {
      if (ev.has_done()) {
        a.done = true;
        continue;
      }
      if (!counted) {
        counted = true;
        ++streaming_;
      }
      a.text += ev.tokens().text();
      a.tokens.insert(a.tokens.end(), ev.tokens().token_ids().begin(),
                      ev.tokens().token_ids().end());
    }
    if (counted) --streaming_;
    a.status = reader->Finish();
    return a;
  }

  // The complete turns of a stored session: (user message, reply), in order.
  static std::vector<std::pair<std::string, std::string>> CompleteTurns(const v1::Session& s) {
    std::vector<std::pair<std::string, std::string>> out;
    std::string user;
    for (const v1::ChatMessage& m : s.messages()) {
      if (m.role() == "user") user = m.content();
      if (m.role() == "assistant" && m.state() == v1::TURN_STATE_COMPLETE) {
        out.emplace_back(user, m.content());
      }
    }
    return out;
  }

  // One client: three turns of session `s`, retrying a broken turn until it is answered.
  void Client(int s, const std::string& id, std::vector<Attempt>* replies,
              std::vector<std::pair<int, Attempt>>* broken) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(90);
    for (int t = 0; t < kTurns; ++t) {
      while (true) {
        if (std::chrono::steady_clock::now() > deadline) return;  // a lost turn: checked below
        Attempt a = Say(s, id, Message(s, t));
        if (a.status.ok() && a.done) {
          (*replies)[t] = std::move(a);
          break;
        }
        broken->emplace_back(t, a);
        // Was it answered before the call broke? (The reply stored complete.) Converse has no
        // idempotency key, so sending the message again would be a new turn: a careful client
        // first reads the session, waiting out a coordinator that is restarting.
        v1::Session stored;
        bool read = Get(id, &stored).ok();
        while (!read && std::chrono::steady_clock::now() < deadline) {
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
          read = Get(id, &stored).ok();
        }
        if (read) {
          const auto turns = CompleteTurns(stored);
          if (static_cast<int>(turns.size()) == t + 1 && turns[t].first == Message(s, t)) {
            Attempt answered;
            answered.status = grpc::Status::OK;
            answered.done = true;
            answered.text = turns[t].second;
            (*replies)[t] = std::move(answered);
            broken->back().second.found_complete = true;
            break;
          }
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
  }

  // Runs six sessions' turns at once; returns each session's replies.
  std::vector<std::vector<Attempt>> RunAll(
      std::vector<std::string>* ids, std::vector<std::vector<std::pair<int, Attempt>>>* broken) {
    std::vector<std::vector<Attempt>> replies(kSessions, std::vector<Attempt>(kTurns));
    broken->assign(kSessions, {});
    ids->assign(kSessions, "");
    for (int s = 0; s < kSessions; ++s) {
      const grpc::Status st = Create(&(*ids)[s]);
      EXPECT_TRUE(st.ok()) << st.error_message();
    }
    std::vector<std::thread> clients;
    for (int s = 0; s < kSessions; ++s) {
      clients.emplace_back([&, s] { Client(s, (*ids)[s], &replies[s], &(*broken)[s]); });
    }
    for (std::thread& c : clients) c.join();
    return replies;
  }

  // Waits (bounded) until at least `n` replies are streaming.
  bool WaitForStreams(int n, std::chrono::milliseconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
      if (streaming_.load() >= n) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return false;
  }

  std::string dir_;
  ServerProcess workers_[kWorkers];
  int worker_ports_[kWorkers] = {};
  ServerProcess coordinator_;
  int coordinator_port_ = 0;
  std::atomic<int> streaming_{0};
};

TEST_F(ChaosTest, KilledWorkersAndCoordinatorLoseNoTurnAndChangeNoToken) {
  // The turns with no fault.
  std::vector<std::string> reference_ids;
  std::vector<std::vector<std::pair<int, Attempt>>> reference_broken;
  const std::vector<std::vector<Attempt>> reference = RunAll(&reference_ids, &reference_broken);
  for (int s = 0; s < kSessions; ++s) {
    ASSERT_TRUE(reference_broken[s].empty())
        << "session " << s
        << " broke with no fault: " << reference_broken[s][0].second.status.error_message();
    for (int t = 0; t < kTurns; ++t) ASSERT_FALSE(reference[s][t].tokens.empty());
  }

  // The same turns while a seeded schedule kills processes.
  std::mt19937 rng(20261126);
  std::atomic<bool> stop{false};
  int worker_kills = 0, coordinator_kills = 0;
  std::mutex restart_mu;
  std::vector<std::thread> restarts;  // a killed worker comes back on its port meanwhile
  std::atomic<bool> down[kWorkers] = {};
  std::thread chaos([&] {
    // A worker, the coordinator, then two more workers; each kill waits for replies to be
    // streaming (bounded: the clients may be between turns).
    for (char what : {'w', 'c', 'w', 'w'}) {
      if (stop || !WaitForStreams(what == 'c' ? 2 : 1, std::chrono::seconds(10))) continue;
      std::this_thread::sleep_for(
          std::chrono::milliseconds(std::uniform_int_distribution<>(0, 30)(rng)));
      if (what == 'c') {
        const int port = coordinator_port_;
        coordinator_.Kill();
        ++coordinator_kills;
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        if (!StartCoordinator(port)) return;
        continue;
      }
      std::vector<int> up;
      for (int i = 0; i < kWorkers; ++i) {
        if (!down[i]) up.push_back(i);
      }
      if (up.size() < 2) continue;  // keep one serving
      const int w = up[std::uniform_int_distribution<size_t>(0, up.size() - 1)(rng)];
      down[w] = true;
      workers_[w].Kill();
      ++worker_kills;
      std::lock_guard<std::mutex> lock(restart_mu);
      restarts.emplace_back([&, w] {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        StartWorker(w, worker_ports_[w]);
        down[w] = false;
      });
    }
  });
  std::vector<std::string> ids;
  std::vector<std::vector<std::pair<int, Attempt>>> broken;
  const std::vector<std::vector<Attempt>> replies = RunAll(&ids, &broken);
  stop = true;
  chaos.join();
  for (std::thread& r : restarts) r.join();
  RecordProperty("worker_kills", worker_kills);
  RecordProperty("coordinator_kills", coordinator_kills);
  EXPECT_GE(worker_kills, 2) << "worker kills did not land while replies streamed";
  EXPECT_EQ(coordinator_kills, 1) << "the coordinator kill did not land while replies streamed";

  int broken_calls = 0, interrupted = 0;
  for (int s = 0; s < kSessions; ++s) {
    SCOPED_TRACE(::testing::Message() << "session " << s);
    broken_calls += static_cast<int>(broken[s].size());
    for (int t = 0; t < kTurns; ++t) {
      ASSERT_TRUE(replies[s][t].done) << "turn " << t << " was lost";
      if (!replies[s][t].tokens.empty()) {
        EXPECT_EQ(replies[s][t].tokens, reference[s][t].tokens)
            << "turn " << t << ": tokens lost, repeated or changed";
      }
      EXPECT_EQ(replies[s][t].text, reference[s][t].text) << "turn " << t;
    }
    v1::Session stored;
    ASSERT_TRUE(Get(ids[s], &stored).ok());
    const auto turns = CompleteTurns(stored);
    ASSERT_EQ(static_cast<int>(turns.size()), kTurns);
    for (int t = 0; t < kTurns; ++t) {
      EXPECT_EQ(turns[t].first, Message(s, t));
      EXPECT_EQ(turns[t].second, reference[s][t].text) << "the stored reply of turn " << t;
    }
    // Every other reply is interrupted or failed, none in progress; an interrupted one is a
    // prefix of its turn's reply.
    std::string user;
    std::map<std::string, std::vector<std::string>> partial;  // by user message
    for (const v1::ChatMessage& m : stored.messages()) {
      if (m.role() == "user") user = m.content();
      if (m.role() != "assistant" || m.state() == v1::TURN_STATE_COMPLETE) continue;
      EXPECT_NE(m.state(), v1::TURN_STATE_IN_PROGRESS) << "a turn left in progress";
      if (m.state() != v1::TURN_STATE_INTERRUPTED) continue;
      ++interrupted;
      int t = 0;
      while (t < kTurns && Message(s, t) != user) ++t;
      ASSERT_LT(t, kTurns) << "an interrupted reply after an unknown message: " << user;
      EXPECT_EQ(reference[s][t].text.rfind(m.content(), 0), 0u)
          << "interrupted reply \"" << m.content() << "\" is not a prefix of turn " << t;
      partial[user].push_back(m.content());
    }
    // What a client was sent of a broken call is stored (at least that much): in an
    // interrupted reply, or, when the call broke after its reply was stored whole (the
    // coordinator died before the client read the end) and the client found it so, in the
    // turn's complete reply.
    for (const auto& [t, a] : broken[s]) {
      if (a.text.empty()) continue;
      std::vector<std::string> held = partial[Message(s, t)];
      if (a.found_complete) held.push_back(turns[t].second);
      bool found = false;
      std::string listed;
      for (const std::string& p : held) {
        found = found || p.rfind(a.text, 0) == 0;
        absl::StrAppend(&listed, "\n  \"", p, "\"");
      }
      EXPECT_TRUE(found) << "turn " << t << ": the client was sent \"" << a.text << "\" ("
                         << a.status.error_message() << ") and no stored reply holds it:" << listed;
    }
  }
  RecordProperty("broken_calls", broken_calls);
  RecordProperty("interrupted_turns_stored", interrupted);
  std::printf(
      "chaos: %d worker kill(s), %d coordinator kill(s), %d broken call(s) retried, "
      "%d interrupted turn(s) stored\n",
      worker_kills, coordinator_kills, broken_calls, interrupted);
}

}  // namespace
}  // namespace recall
