// Serving benchmark: N concurrent multi-turn sessions against one recall-worker process
// (random-weight SmolLM2-135M shape on the CPU, over loopback gRPC).
//
//   1. Throughput: the same sessions served one at a time (baseline) and all at once
//      (continuous batching); generated tokens/s of each and the ratio; p50/p99 time to
//      first token and time per output token (client side).
//   2. Capacity: how many sessions stay resident in a fixed KV pool after one long turn each,
//      with FullKV (baseline) and LazyEviction at a 30% budget (ratio; target >= 2.5x). The
//      worker runs with --host-cache-bytes 0 so sessions that do not fit are dropped.
//
// usage: recall_serving_bench [--sessions N] [--turns N] [--max-tokens N] [--threads N]
//                             [--capacity 0|1] [--worker-flag FLAG]...
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_util.h"
#include "bench/serving_util.h"
#include "common/flags.h"
#include "grpcpp/grpcpp.h"
#include "recall/v1/worker.grpc.pb.h"

namespace recall::bench {
namespace {

using Clock = std::chrono::steady_clock;

struct Flags {
  std::string config_dir = std::string(RECALL_SHARED_DIR_DEFAULT) + "/tokenizers/smollm2";
  int sessions = 8;
  int turns = 2;
  int max_tokens = 32;
  int prompt_words = 60;
  // One compute thread by default: this benchmark's client threads and the worker's gRPC
  // threads share the machine, and on a 2-core machine a second spinning compute thread
  // fights them (measured: batched decode steps 2x slower). Baseline and batched runs use
  // the same worker, so the ratio stays fair.
  int threads = 1;
  bool throughput = true;                 // section 1 (timed)
  bool capacity = true;                   // section 2 (counts: not timed)
  std::vector<std::string> worker_flags;  // extra recall-worker flags (--worker-flag X)
};

const flags::FlagSet<Flags>& ServingFlags() {
  static const flags::FlagSet<Flags> f = [] {
    flags::FlagSet<Flags> s;
    s.Int(
         "sessions", "N", "concurrent sessions in the throughput part (default 8)",
         [](auto& o) -> auto& { return o.sessions; }, 1, 10000)
        .Int(
            "turns", "N", "turns per session (default 2)", [](auto& o) -> auto& { return o.turns; },
            1, 100000)
        .Int(
            "max-tokens", "N", "tokens generated per turn (default 32)",
            [](auto& o) -> auto& { return o.max_tokens; }, 1, 2048)
        .Int(
            "threads", "N",
            "the worker's compute threads (default 1; 0: the worker's default,\nall cores)",
            [](auto& o) -> auto& { return o.threads; }, 0, 4096)
        .Int(
            "throughput", "0|1", "run the throughput part (default 1)",
            [](auto& o) -> auto& { return o.throughput; }, 0, 1)
        .Int(
            "capacity", "0|1", "run the capacity part (default 1)",
            [](auto& o) -> auto& { return o.capacity; }, 0, 1)
        .List(
            "worker-flag", "FLAG",
            "one more argument for every recall-worker started (repeatable, one\n"
            "argument each: --worker-flag --kv-dtype --worker-flag f32)",
            [](auto& o) -> auto& { return o.worker_flags; });
    return s;
  }();
  return f;
}

struct TurnStats {
  bool ok = false;
  std::string error;
  int generated = 0;
  double ttft = 0;   // seconds
  double tpot = 0;   // seconds per output token after the first
  int64_t kv_bytes = 0;  // the session's KV bytes after the turn
};

class Client {
 public:
  explicit Client(int port)
      : stub_(v1::Worker::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                                      grpc::InsecureChannelCredentials()))) {}

  TurnStats Turn(const std::string& session, const std::string& text, int history_length,
                 int max_tokens, const v1::CacheSettings* cache = nullptr) {
    v1::RunTurnRequest r;
    r.set_session_id(session);
    auto* m = r.add_messages();
    m->set_role("user");
    m->set_content(text);
    r.set_history_length(history_length);
    r.mutable_sampling()->set_temperature(0);
    r.mutable_sampling()->set_max_tokens(max_tokens);
    if (cache != nullptr) *r.mutable_cache() = *cache;
    grpc::ClientContext ctx;
    const auto start = Clock::now();
    auto reader = stub_->RunTurn(&ctx, r);
    v1::TurnEvent ev;
    TurnStats s;
    Clock::time_point first, last;
    while (reader->Read(&ev)) {
      if (ev.has_done()) s.kv_bytes = ev.done().kv_bytes();
      if (!ev.has_tokens() || ev.tokens().token_ids_size() == 0) continue;
      last = Clock::now();
      if (s.generated == 0) first = last;
      s.generated += ev.tokens().token_ids_size();
    }
    grpc::Status st = reader->Finish();
    s.ok = st.ok();
    s.error = st.error_message();
    s.ttft = std::chrono::duration<double>(first - start).count();
    if (s.generated > 1) {
      s.tpot = std::chrono::duration<double>(last - first).count() / (s.generated - 1);
    }
    return s;
  }

  v1::LoadReport Load() {
    grpc::ClientContext ctx;
    v1::LoadReport load;
    stub_->GetLoad(&ctx, v1::GetLoadRequest(), &load);
    return load;
  }

 private:
  std::unique_ptr<v1::Worker::Stub> stub_;
};

bool StartWorker(ServerProcess& worker, const Flags& f, std::vector<std::string> extra) {
  std::vector<std::string> args = {"--model", f.config_dir, "--random-weights", "--dtype", "bf16",
                                   "--listen", "127.0.0.1:0", "--max-tokens-limit", "2048"};
  if (f.threads > 0) {
    args.push_back("--threads");
    args.push_back(std::to_string(f.threads));
  }
  args.insert(args.end(), extra.begin(), extra.end());
  args.insert(args.end(), f.worker_flags.begin(), f.worker_flags.end());
  return StartServer(worker, RECALL_WORKER_BINARY, args);
}

// Runs every session's turns; `concurrent` runs the sessions in parallel threads.
struct RunResult {
  double seconds = 0;
  int generated = 0;
  int failed = 0;
  std::vector<double> ttft, tpot;
};

RunResult RunSessions(Client& client, const Flags& f, const std::string& prefix, bool concurrent) {
  RunResult out;
  std::mutex mu;
  auto session = [&](int i) {
    for (int t = 0; t < f.turns; ++t) {
      const std::string text = t == 0 ? FillerText(i, f.prompt_words) : FillerText(1000 * t + i, 12);
      TurnStats s = client.Turn(prefix + std::to_string(i), text, 2 * t, f.max_tokens);
      std::lock_guard<std::mutex> lock(mu);
      if (!s.ok) {
        ++out.failed;
        std::printf("  turn failed: %s\n", s.error.c_str());
        return;
      }
      out.generated += s.generated;
      out.ttft.push_back(s.ttft);
      if (s.generated > 1) out.tpot.push_back(s.tpot);
    }
  };
  const auto start = Clock::now();
  if (concurrent) {
    std::vector<std::thread> threads;
    for (int i = 0; i < f.sessions; ++i) threads.emplace_back(session, i);
    for (auto& th : threads) th.join();
  } else {
    for (int i = 0; i < f.sessions; ++i) session(i);
  }
  out.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return out;
}

void PrintRun(const char* name, const RunResult& r) {
  std::printf("  %-22s %6.1f gen tok/s  (%d tokens in %.2f s)  TTFT p50 %.0f ms p99 %.0f ms  "
              "TPOT p50 %.1f ms p99 %.1f ms%s\n",
              name, r.generated / r.seconds, r.generated, r.seconds,
              1e3 * Percentile(r.ttft, 0.5), 1e3 * Percentile(r.ttft, 0.99),
              1e3 * Percentile(r.tpot, 0.5), 1e3 * Percentile(r.tpot, 0.99),
              r.failed ? "  (some turns FAILED)" : "");
}

struct Capacity {
  int failed = 0;           // turns that failed
  int resident = -1;        // sessions still resident after all ran (measured)
  double mean_kv_bytes = 0; // KV bytes an idle session holds after its turn
  int64_t pool_bytes = 0;
};

// Runs `n` sessions one after another, one turn each (a ~3x prompt_words prompt + `gen`
// tokens), in a pool of `pool` bytes with no host offload: sessions that no longer fit are
// dropped (least recently used first).
Capacity MeasureCapacity(const Flags& f, const char* pool, int n, int gen,
                         const v1::CacheSettings* cache) {
  Capacity c;
  ServerProcess worker;
  if (!StartWorker(worker, f, {"--kv-cache-bytes", pool, "--host-cache-bytes", "0"})) {
    c.failed = n;
    return c;
  }
  Client client(worker.port("grpc"));
  double kv = 0;
  int ok = 0;
  for (int i = 0; i < n; ++i) {
    TurnStats s = client.Turn("fit" + std::to_string(i), FillerText(i, f.prompt_words * 3), 0, gen,
                              cache);
    if (!s.ok) {
      std::printf("  turn failed: %s\n", s.error.c_str());
      ++c.failed;
      continue;
    }
    kv += s.kv_bytes;
    ++ok;
  }
  const v1::LoadReport load = client.Load();
  c.resident = load.resident_sessions();
  c.mean_kv_bytes = ok > 0 ? kv / ok : 0;
  c.pool_bytes = load.kv_blocks_total() * load.kv_block_bytes();
  return c;
}

constexpr char kUsageHead[] =
    R"U(usage: recall_serving_bench [--sessions N] [--turns N] [--max-tokens N] [--threads N]
                            [--throughput 0|1] [--capacity 0|1] [--worker-flag FLAG]...

Concurrent multi-turn sessions against one recall-worker process (SmolLM2-135M's shape from
)U" RECALL_SHARED_DIR_DEFAULT
    R"U(/tokenizers/smollm2/config.json, random bf16 weights, CPU, loopback gRPC;
skipped when the config is missing):
1. throughput: the sessions served one at a time (the baseline) and all at once (continuous
   batching); generated tokens/s and the ratio, p50/p99 time to first token and per output
   token (client side);
2. capacity: 20 sessions one after another, one long turn each, in a 32 MiB KV pool with no
   host offload; how many stay resident with FullKV (the baseline) and with lazy at a 30%
   budget, and the ratio.
Exits 1 after its tables when a turn failed.

options:
)U";

// The exit code: 1 (after a line saying so) when turns failed, whose figures are then not
// results.
int Finish(int failed) {
  if (failed == 0) return 0;
  std::fprintf(stderr, "FAIL: %d turn(s) failed; the figures above are not results\n", failed);
  return 1;
}

int Main(int argc, char** argv) {
  Flags f;
  if (int rc = ParseBenchFlags(argc, argv, "recall_serving_bench", kUsageHead, ServingFlags(), &f);
      rc >= 0) {
    return rc;
  }
  if (!std::filesystem::exists(f.config_dir + "/config.json")) {
    std::printf("SKIP: %s/config.json is missing (set up ../shared)\n", f.config_dir.c_str());
    return 0;
  }
  int failed = 0;  // turns that failed, in every part
  std::printf("serving benchmark: recall-worker, SmolLM2-135M shape, random bf16 weights, CPU, "
              "%d compute thread(s)\n", f.threads);
  if (f.throughput) {
    std::printf("\n1. throughput: %d sessions x %d turns, %d generated tokens per turn, greedy\n",
                f.sessions, f.turns, f.max_tokens);
    ServerProcess worker;
    if (!StartWorker(worker, f, {"--kv-cache-bytes", "1G"})) return 1;
    Client client(worker.port("grpc"));
    client.Turn("warmup", FillerText(99, 20), 0, 4);
    const RunResult one = RunSessions(client, f, "seq", false);
    const RunResult all = RunSessions(client, f, "conc", true);
    PrintRun("one at a time (base)", one);
    PrintRun("continuous batching", all);
    std::printf("  ratio: continuous batching / one at a time = %.2fx generated tokens/s\n",
                (all.generated / all.seconds) / (one.generated / one.seconds));
    failed += one.failed + all.failed;
  }
  if (!f.capacity) return Finish(failed);

  // A pool that neither FullKV nor lazy sessions fill with fewer than n (bf16 KV: 32M holds
  // what 64M held in f32, where these figures were first taken). The idle bytes include the
  // policy's state, which the pool holds too.
  const int n = 20, gen = 64;
  const char* pool = "32M";
  std::printf("\n2. capacity: %d sessions one after another, one turn each (~%d-word prompt + "
              "%d tokens), KV pool %s, no host offload (sessions that do not fit are dropped)\n",
              n, f.prompt_words * 3, gen, pool);
  const Capacity full = MeasureCapacity(f, pool, n, gen, nullptr);
  v1::CacheSettings lazy;
  lazy.set_policy("lazy");
  lazy.set_budget_fraction(0.3f);
  lazy.set_window(16);
  const Capacity lz = MeasureCapacity(f, pool, n, gen, &lazy);
  auto print = [](const char* name, const Capacity& c) {
    std::printf("  %-24s %2d sessions resident at the end; an idle session holds %.2f MiB, so "
                "the pool holds %.1f idle sessions\n",
                name, c.resident, c.mean_kv_bytes / 1048576.0,
                c.mean_kv_bytes > 0 ? c.pool_bytes / c.mean_kv_bytes : 0.0);
  };
  print("FullKV (base)", full);
  print("lazy, 30% budget, W=16", lz);
  if (full.resident > 0 && lz.mean_kv_bytes > 0) {
    std::printf("  ratio: lazy / FullKV = %.2fx sessions resident, %.2fx idle sessions per pool "
                "(target >= 2.5x)\n",
                static_cast<double>(lz.resident) / full.resident,
                full.mean_kv_bytes / lz.mean_kv_bytes);
  }
  return Finish(failed + full.failed + lz.failed);
}

}  // namespace
}  // namespace recall::bench

int main(int argc, char** argv) { return recall::bench::Main(argc, argv); }
