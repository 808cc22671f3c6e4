// Journal benchmark: what storing a streaming reply costs the SQLite session store, one write
// per token as TurnJournal does when the store keeps up. Baseline: each write replaces the
// whole reply (Replace, the journal before reply parts); measured: each write appends the
// token (AppendReply, a part). Prints, per reply length, the seconds for the whole reply, the
// mean time of the last 100 writes, and the ratio baseline / parts. Same file system, same
// run, alternating.
//
// usage: recall_journal_bench [--tokens 1000,4000,16000] [--dir DIR]
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench/bench_util.h"
#include "coordinator/session_store.h"

namespace recall::bench {
namespace {

using Clock = std::chrono::steady_clock;
using coordinator::SessionRecord;
using coordinator::SessionStore;
using coordinator::StoredMessage;
using coordinator::TurnState;

struct Timing {
  double total_s = 0;
  double last_ms = 0;  // mean of the last 100 writes
};

// One reply of `tokens` tokens (" word" each) written token by token into a new session.
Timing WriteReply(SessionStore& store, const std::string& session, int tokens, bool parts) {
  SessionRecord r;
  r.id = session;
  r.tenant = "t";
  r.model = "m";
  if (!store.Create(r).ok()) std::abort();
  StoredMessage whole{"assistant", ""};
  whole.state = TurnState::kInProgress;
  whole.lease_unix_ms = 4102444800000;
  if (!store.AppendAll("t", session, 0, {{"user", "hi"}, whole}).ok()) std::abort();
  Timing t;
  const Clock::time_point start = Clock::now();
  Clock::time_point tail = start;
  for (int i = 0; i < tokens; ++i) {
    if (i == tokens - 100) tail = Clock::now();
    StoredMessage delta;
    delta.content = " word";
    delta.token_ids = {i};
    whole.content += delta.content;
    whole.token_ids.push_back(i);
    const absl::Status st = parts ? store.AppendReply("t", session, 1, delta, whole)
                                  : store.Replace("t", session, 1, whole);
    if (!st.ok()) {
      std::fprintf(stderr, "write failed: %s\n", std::string(st.message()).c_str());
      std::abort();
    }
  }
  const Clock::time_point end = Clock::now();
  t.total_s = std::chrono::duration<double>(end - start).count();
  t.last_ms = std::chrono::duration<double, std::milli>(end - tail).count() / 100.0;
  whole.state = TurnState::kComplete;
  if (!store.Replace("t", session, 1, whole).ok()) std::abort();
  return t;
}

constexpr char kUsage[] =
    R"U(usage: recall_journal_bench [--tokens 1000,4000,16000] [--dir DIR]

What storing a streaming reply costs the SQLite session store: each reply written token by
token into a new session, once replacing the whole reply at every write (the baseline) and
once appending the token as a reply part. Prints, per reply length, the seconds for the whole
reply, the mean time of the last 100 writes, and the ratio baseline / parts.

options:
  --tokens LIST           reply lengths in tokens, each at least 100 (default 1000,4000,16000)
  --dir DIR               where the store (DIR/sessions.db) is made; emptied first and removed
                          at the end (default: recall_journal_bench in the temporary directory,
                          $TMPDIR or /tmp)
  -h, --help              print this and exit
)U";

int Main(int argc, char** argv) {
  if (PrintHelpIfAsked(argc, argv, kUsage)) return 0;
  std::vector<int> lengths = {1000, 4000, 16000};
  std::string dir = std::filesystem::temp_directory_path() / "recall_journal_bench";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--tokens") {
      lengths.clear();
      for (absl::string_view s : absl::StrSplit(v, ',')) {
        int n = 0;
        if (!absl::SimpleAtoi(s, &n) || n < 100) {
          std::fprintf(stderr, "--tokens: %s is not a number >= 100\n", std::string(s).c_str());
          return 2;
        }
        lengths.push_back(n);
      }
    } else if (a == "--dir") {
      dir = v;
    } else {
      std::fprintf(stderr, "unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  auto store = coordinator::OpenStore(dir + "/sessions.db");
  if (!store.ok()) {
    std::fprintf(stderr, "%s\n", std::string(store.status().message()).c_str());
    return 1;
  }
  std::printf("reply tokens | replace whole: s, last ms/write | parts: s, last ms/write | ratio\n");
  int n = 0;
  for (const int tokens : lengths) {
    const Timing whole = WriteReply(**store, "w" + std::to_string(n), tokens, false);
    const Timing parts = WriteReply(**store, "p" + std::to_string(n), tokens, true);
    ++n;
    std::printf("%12d | %7.2f s, %6.3f ms | %7.2f s, %6.3f ms | %5.1fx\n", tokens, whole.total_s,
                whole.last_ms, parts.total_s, parts.last_ms, whole.total_s / parts.total_s);
  }
  std::filesystem::remove_all(dir);
  return 0;
}

}  // namespace
}  // namespace recall::bench

int main(int argc, char** argv) { return recall::bench::Main(argc, argv); }
