// Coordinator benchmark: what the coordinator adds, on stories260K (real weights, fast on
// the CPU, so the hop's cost is visible next to a decode step).
//
//   1. Latency: N concurrent sessions x T turns sent straight to a worker (RunTurn: the
//      baseline) and through the coordinator (Converse); client-side time to first token and
//      time per output token, p50/p99, and their ratios coordinator / direct.
//   2. Scaling: the same load through the coordinator with 1 and then 2 workers; generated
//      tokens/s and the ratio. Every worker runs one compute thread; on a machine with fewer
//      cores than workers + clients the ratio mostly measures the cores.
//   3. A long session: the time of a turn late in a 2000-turn session against early in it.
//
// usage: recall_coordinator_bench [--sessions N] [--turns N] [--max-tokens N] [--long-turns N]
//                                 [--long-stop S]
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <set>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "bench/serving_util.h"
#include "common/flags.h"
#include "grpcpp/grpcpp.h"
#include "recall/v1/chat.grpc.pb.h"
#include "recall/v1/worker.grpc.pb.h"

namespace recall::bench {
namespace {

using Clock = std::chrono::steady_clock;
const std::string kShared = RECALL_SHARED_DIR_DEFAULT;

struct Stats {
  std::vector<double> ttft, tpot;
  int generated = 0;
  int failed = 0;
  double seconds = 0;
};

// Reads a stream of events with token ids; records TTFT and per-token gaps.
template <typename Reader, typename Event, typename Tokens>
void Read(Reader& reader, Clock::time_point start, Tokens tokens_of, Stats* st, std::mutex* mu) {
  Event ev;
  int n = 0;
  Clock::time_point first, last;
  while (reader->Read(&ev)) {
    const int k = tokens_of(ev);
    if (k == 0) continue;
    last = Clock::now();
    if (n == 0) first = last;
    n += k;
  }
  const bool ok = reader->Finish().ok();
  std::lock_guard<std::mutex> lock(*mu);
  if (!ok || n == 0) {
    ++st->failed;
    return;
  }
  st->generated += n;
  st->ttft.push_back(std::chrono::duration<double>(first - start).count());
  if (n > 1) st->tpot.push_back(std::chrono::duration<double>(last - first).count() / (n - 1));
}

Stats Direct(int port, int sessions, int turns, int max_tokens) {
  auto stub = v1::Worker::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                                      grpc::InsecureChannelCredentials()));
  Stats st;
  std::mutex mu;
  const auto t0 = Clock::now();
  std::vector<std::thread> threads;
  for (int s = 0; s < sessions; ++s) {
    threads.emplace_back([&, s] {
      for (int t = 0; t < turns; ++t) {
        v1::RunTurnRequest r;
        r.set_session_id("direct" + std::to_string(s));
        auto* m = r.add_messages();
        m->set_role("user");
        m->set_content(t == 0 ? "Once upon a time" : FillerText(t * 100 + s, 6));
        r.set_history_length(2 * t);
        r.mutable_sampling()->set_temperature(0);
        r.mutable_sampling()->set_max_tokens(max_tokens);
        grpc::ClientContext ctx;
        const auto start = Clock::now();
        auto reader = stub->RunTurn(&ctx, r);
        Read<decltype(reader), v1::TurnEvent>(
            reader, start, [](const v1::TurnEvent& e) { return e.tokens().token_ids_size(); },
            &st, &mu);
      }
    });
  }
  for (auto& th : threads) th.join();
  st.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return st;
}

Stats ViaCoordinator(int port, int sessions, int turns, int max_tokens) {
  auto stub = v1::Chat::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                                    grpc::InsecureChannelCredentials()));
  Stats st;
  std::mutex mu;
  const auto t0 = Clock::now();
  std::vector<std::thread> threads;
  for (int s = 0; s < sessions; ++s) {
    threads.emplace_back([&, s] {
      grpc::ClientContext cctx;
      v1::Session session;
      if (!stub->CreateSession(&cctx, v1::CreateSessionRequest(), &session).ok()) {
        std::lock_guard<std::mutex> lock(mu);
        ++st.failed;
        return;
      }
      for (int t = 0; t < turns; ++t) {
        v1::ConverseRequest r;
        r.set_session_id(session.session_id());
        r.set_message(t == 0 ? "Once upon a time" : FillerText(t * 100 + s, 6));
        r.mutable_sampling()->set_temperature(0);
        r.mutable_sampling()->set_max_tokens(max_tokens);
        grpc::ClientContext ctx;
        const auto start = Clock::now();
        auto reader = stub->Converse(&ctx, r);
        Read<decltype(reader), v1::ConverseEvent>(
            reader, start, [](const v1::ConverseEvent& e) { return e.tokens().token_ids_size(); },
            &st, &mu);
      }
    });
  }
  for (auto& th : threads) th.join();
  st.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  return st;
}

// One session of `turns` turns through the coordinator (policy lazy, budget 128: its KV cache
// stays the same size, so any growth in a turn's time is what the rest of the path does with
// the longer transcript); each turn's client-side time, from the request to the stream's end.
// Empty when a turn fails (printed).
// Part 3's run: each turn's time, and how many turns ended at a stop (token or string) and
// were rebuilt.
struct LongRun {
  std::vector<double> seconds;
  int stopped = 0;
  int rebuilt = 0;
};

LongRun LongSession(int port, int turns, int message_words, const std::string& stop) {
  auto stub = v1::Chat::NewStub(
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  grpc::ClientContext cctx;
  v1::CreateSessionRequest create;
  create.mutable_cache()->set_policy("lazy");
  create.mutable_cache()->set_budget_tokens(128);
  v1::Session session;
  if (grpc::Status st = stub->CreateSession(&cctx, create, &session); !st.ok()) {
    std::printf("FAIL: CreateSession: %s\n", st.error_message().c_str());
    return {};
  }
  LongRun run;
  for (int t = 0; t < turns; ++t) {
    v1::ConverseRequest r;
    r.set_session_id(session.session_id());
    r.set_message(FillerText(t, message_words));
    r.set_turn_id("t" + std::to_string(t));  // as the C++ SDK sends
    r.mutable_sampling()->set_temperature(0);
    r.mutable_sampling()->set_max_tokens(4);
    if (!stop.empty()) r.mutable_sampling()->add_stop(stop);
    grpc::ClientContext ctx;
    const auto start = Clock::now();
    auto reader = stub->Converse(&ctx, r);
    v1::ConverseEvent ev;
    while (reader->Read(&ev)) {
      if (!ev.has_done()) continue;
      run.stopped += ev.done().finish_reason() == v1::FINISH_REASON_STOP;
      run.rebuilt += ev.done().rebuilt();
    }
    if (grpc::Status st = reader->Finish(); !st.ok()) {
      std::printf("FAIL: turn %d: %s\n", t + 1, st.error_message().c_str());
      return {};
    }
    run.seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  return run;
}

void Print(const char* name, const Stats& s) {
  std::printf("  %-26s %7.1f gen tok/s  TTFT p50 %6.2f ms p99 %6.2f ms  TPOT p50 %5.2f ms "
              "p99 %5.2f ms%s\n",
              name, s.generated / s.seconds, 1e3 * Percentile(s.ttft, 0.5),
              1e3 * Percentile(s.ttft, 0.99), 1e3 * Percentile(s.tpot, 0.5),
              1e3 * Percentile(s.tpot, 0.99), s.failed ? "  (some turns FAILED)" : "");
}

bool StartWorkerProcess(ServerProcess& w) {
  return StartServer(w, RECALL_WORKER_BINARY,
                     {"--model", kShared + "/models/stories260K/stories260K.bin", "--tokenizer",
                      kShared + "/models/stories260K/tok512.bin", "--listen", "127.0.0.1:0",
                      "--kv-cache-bytes", "64M", "--threads", "1"});
}

// Starts a coordinator with a new, empty store: in a fresh directory inside `scratch` (this
// run's own directory, made by MakeScratchDir), so no earlier run's sessions are seen.
bool StartCoordinatorProcess(ServerProcess& c, const std::vector<ServerProcess*>& workers,
                             const std::string& scratch) {
  std::string list;
  for (ServerProcess* w : workers) {
    list += (list.empty() ? "" : ",") + std::string("127.0.0.1:") + std::to_string(w->port("grpc"));
  }
  static int starts = 0;
  const std::string dir = scratch + "/store" + std::to_string(++starts);
  return StartServer(c, RECALL_COORDINATOR_BINARY,
                     {"--workers", list, "--listen", "127.0.0.1:0", "--data-dir", dir});
}

struct Options {
  int sessions = 8;
  int turns = 3;
  int max_tokens = 64;
  int long_turns = 2000;
  std::string long_stop;
};

// Part 3 compares turns 21-120 with the middle and the last 100: it needs 220 turns.
constexpr int kLongTurnsMin = 220;

const flags::FlagSet<Options>& CoordinatorFlags() {
  static const flags::FlagSet<Options> f = [] {
    flags::FlagSet<Options> s;
    s.Int(
         "sessions", "N", "concurrent sessions (default 8; the scaling part runs 2N)",
         [](auto& o) -> auto& { return o.sessions; }, 1, 10000)
        .Int(
            "turns", "N", "turns per session (default 3)", [](auto& o) -> auto& { return o.turns; },
            1, 100000)
        .Int(
            "max-tokens", "N", "tokens generated per turn (default 64; at most 512, the context)",
            [](auto& o) -> auto& { return o.max_tokens; }, 1, 512)
        .Int(
            "long-turns", "N",
            "turns of part 3's session (default 2000; 0 skips part 3, else at\nleast 220: "
            "its windows are turns 21-120, the middle 100 and\nthe last 100)",
            [](auto& o) -> auto& { return o.long_turns; }, 0, 10000000)
        .Text(
            "long-stop", "S",
            "a stop string for part 3's turns (e.g. \"e \": replies are cut\n"
            "at it, and the worker gives back the tokens after the cut)",
            [](auto& o) -> auto& { return o.long_stop; })
        .Check([](const Options& o, const std::set<std::string>&) -> absl::Status {
          if (o.long_turns != 0 && o.long_turns < kLongTurnsMin) {
            return absl::InvalidArgumentError(
                absl::StrCat("--long-turns: must be 0 (no part 3) or at least ", kLongTurnsMin,
                             ", got ", o.long_turns));
          }
          return absl::OkStatus();
        });
    return s;
  }();
  return f;
}

constexpr char kUsageHead[] =
    R"U(usage: recall_coordinator_bench [--sessions N] [--turns N] [--max-tokens N]
                                [--long-turns N] [--long-stop S]

What the coordinator adds, on stories260K from
)U" RECALL_SHARED_DIR_DEFAULT
    R"U(/models/stories260K (skipped when missing).
Starts two recall-worker processes (one compute thread each) and a recall-coordinator on
loopback (its store in a new directory recall_coordinator_bench.XXXXXX in $TMPDIR or /tmp,
removed at the end), then:
1. latency: the sessions' turns sent straight to a worker and through the coordinator,
   greedy; client-side time to first token and per output token (p50, p99) and the ratios;
2. scaling: twice the sessions through the coordinator with one and then two workers;
   generated tokens/s and the ratio.
Exits 1 after its tables when a turn failed.

options:
)U";

constexpr char kUsageTail[] =
    R"U(
3. a long session (unless --long-turns 0): one session (policy lazy, budget 128) of
   --long-turns turns of about 60 words each, 4 tokens generated per turn; the median turn
   time of turns 21-120 (the base), of the middle 100 and of the last 100, and the ratios
   (1.00x: a turn costs the same however long the session is); how many turns ended at a
   stop (token or string) and how many were rebuilt.
)U";

// The exit code: 1 (after a line saying so) when turns failed, whose figures are then not
// results.
int Finish(int failed) {
  if (failed == 0) return 0;
  std::fprintf(stderr, "FAIL: %d turn(s) failed; the figures above are not results\n", failed);
  return 1;
}

int Run(const Options& o, const std::string& scratch);

int Main(int argc, char** argv) {
  Options o;
  if (int rc = ParseBenchFlags(argc, argv, "recall_coordinator_bench", kUsageHead,
                               CoordinatorFlags(), &o, kUsageTail);
      rc >= 0) {
    return rc;
  }
  if (std::error_code ec;
      !std::filesystem::exists(kShared + "/models/stories260K/stories260K.bin", ec)) {
    std::printf("SKIP: %s/models/stories260K is missing\n", kShared.c_str());
    return 0;
  }
  std::error_code ec;
  std::string tmp = std::filesystem::temp_directory_path(ec).string();
  if (ec) tmp = "/tmp";
  const absl::StatusOr<std::string> scratch =
      MakeScratchDir("$TMPDIR", tmp, "recall_coordinator_bench");
  if (!scratch.ok()) {
    std::fprintf(stderr, "recall_coordinator_bench: %s\n",
                 std::string(scratch.status().message()).c_str());
    return 1;
  }
  const int rc = Run(o, *scratch);
  RemoveScratchDir(*scratch);
  return rc;
}

int Run(const Options& o, const std::string& scratch) {
  const int sessions = o.sessions, turns = o.turns, max_tokens = o.max_tokens,
            long_turns = o.long_turns;
  const std::string& long_stop = o.long_stop;
  std::printf("coordinator benchmark: stories260K, %d concurrent sessions x %d turns x %d "
              "tokens, greedy, 1 compute thread per worker\n\n1. latency, one worker\n",
              sessions, turns, max_tokens);
  ServerProcess w1, w2, coordinator;
  if (!StartWorkerProcess(w1) || !StartWorkerProcess(w2)) return 1;
  if (!StartCoordinatorProcess(coordinator, {&w1}, scratch)) return 1;
  Direct(w1.port("grpc"), 2, 1, 8);  // warm up
  const Stats direct = Direct(w1.port("grpc"), sessions, turns, max_tokens);
  const Stats via = ViaCoordinator(coordinator.port("grpc"), sessions, turns, max_tokens);
  Print("direct to the worker (base)", direct);
  Print("through the coordinator", via);
  std::printf("  ratios coordinator / direct: TTFT p50 %.2fx p99 %.2fx, TPOT p50 %.2fx p99 "
              "%.2fx, tokens/s %.2fx\n",
              Percentile(via.ttft, 0.5) / Percentile(direct.ttft, 0.5),
              Percentile(via.ttft, 0.99) / Percentile(direct.ttft, 0.99),
              Percentile(via.tpot, 0.5) / Percentile(direct.tpot, 0.5),
              Percentile(via.tpot, 0.99) / Percentile(direct.tpot, 0.99),
              (via.generated / via.seconds) / (direct.generated / direct.seconds));
  coordinator.Stop();

  std::printf("\n2. scaling through the coordinator, %d sessions\n", 2 * sessions);
  if (!StartCoordinatorProcess(coordinator, {&w1}, scratch)) return 1;
  const Stats one = ViaCoordinator(coordinator.port("grpc"), 2 * sessions, turns, max_tokens);
  coordinator.Stop();
  if (!StartCoordinatorProcess(coordinator, {&w1, &w2}, scratch)) {
    return 1;
  }
  const Stats two = ViaCoordinator(coordinator.port("grpc"), 2 * sessions, turns, max_tokens);
  Print("1 worker (base)", one);
  Print("2 workers", two);
  std::printf("  ratio 2 workers / 1 worker = %.2fx generated tokens/s (%u cores here)\n",
              (two.generated / two.seconds) / (one.generated / one.seconds),
              std::thread::hardware_concurrency());
  coordinator.Stop();
  const int failed = direct.failed + via.failed + one.failed + two.failed;
  if (long_turns == 0) return Finish(failed);

  std::printf("\n3. a long session, %d turns (lazy, budget 128)%s%s%s\n", long_turns,
              long_stop.empty() ? "" : ", stop string \"", long_stop.c_str(),
              long_stop.empty() ? "" : "\"");
  if (!StartCoordinatorProcess(coordinator, {&w1}, scratch)) return 1;
  const LongRun run = LongSession(coordinator.port("grpc"), long_turns, 60, long_stop);
  const std::vector<double>& t = run.seconds;
  if (t.empty()) return 1;  // a turn failed (printed)
  const std::vector<double> early(t.begin() + 20, t.begin() + 120);
  const auto half = t.begin() + static_cast<std::ptrdiff_t>(t.size() / 2);
  const std::vector<double> middle(half - 50, half + 50);
  const std::vector<double> late(t.end() - 100, t.end());
  std::printf("  turns 21-120 (base)        median %6.2f ms\n", 1e3 * Percentile(early, 0.5));
  std::printf("  the middle 100 turns       median %6.2f ms\n", 1e3 * Percentile(middle, 0.5));
  std::printf("  the last 100 turns         median %6.2f ms\n", 1e3 * Percentile(late, 0.5));
  std::printf("  ratios: last 100 / turns 21-120 = %.2fx, last 100 / middle 100 = %.2fx\n",
              Percentile(late, 0.5) / Percentile(early, 0.5),
              Percentile(late, 0.5) / Percentile(middle, 0.5));
  std::printf("  turns ended at a stop (token or string): %d of %d; rebuilt: %d\n", run.stopped,
              long_turns, run.rebuilt);
  return Finish(failed);
}

}  // namespace
}  // namespace recall::bench

int main(int argc, char** argv) { return recall::bench::Main(argc, argv); }
