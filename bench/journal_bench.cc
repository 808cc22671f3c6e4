// Journal benchmark: what storing a streaming reply costs the SQLite session store, one write
// per token as TurnJournal does when the store keeps up. Baseline: each write replaces the
// whole reply (Replace, the journal before reply parts); measured: each write appends the
// token (AppendReply, a part). Prints, per reply length, the seconds for the whole reply, the
// mean time of the last 100 writes, and the ratio baseline / parts. Same file system, same
// run, alternating.
//
// usage: recall_journal_bench [--tokens 1000,4000,16000] [--dir DIR]
// The store is made in a new directory inside DIR (mkdtemp), removed at the end; DIR itself
// and everything else in it are left alone.
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/bench_util.h"
#include "common/flags.h"
#include "common/status.h"
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
absl::StatusOr<Timing> WriteReply(SessionStore& store, const std::string& session, int tokens,
                                  bool parts) {
  SessionRecord r;
  r.id = session;
  r.tenant = "t";
  r.model = "m";
  RECALL_RETURN_IF_ERROR(store.Create(r));
  StoredMessage whole{"assistant", ""};
  whole.state = TurnState::kInProgress;
  whole.lease_unix_ms = 4102444800000;
  RECALL_RETURN_IF_ERROR(store.AppendAll("t", session, 0, {{"user", "hi"}, whole}));
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
    RECALL_RETURN_IF_ERROR(parts ? store.AppendReply("t", session, 1, delta, whole)
                                 : store.Replace("t", session, 1, whole));
  }
  const Clock::time_point end = Clock::now();
  t.total_s = std::chrono::duration<double>(end - start).count();
  t.last_ms = std::chrono::duration<double, std::milli>(end - tail).count() / 100.0;
  whole.state = TurnState::kComplete;
  RECALL_RETURN_IF_ERROR(store.Replace("t", session, 1, whole));
  return t;
}

struct Options {
  std::vector<int> tokens = {1000, 4000, 16000};
  std::string dir;  // empty: the temporary directory ($TMPDIR or /tmp)
};

const flags::FlagSet<Options>& JournalFlags() {
  static const flags::FlagSet<Options> f = [] {
    flags::FlagSet<Options> s;
    s.Value(
         "tokens", "LIST",
         "reply lengths in tokens, comma-separated, each at least 100\n"
         "(default 1000,4000,16000)",
         [](auto& o) -> auto& { return o.tokens; }, 100, 100000000)
        .String(
            "dir", "DIR",
            "an existing directory in which the store is made, in a new directory\n"
            "recall_journal_bench.XXXXXX (DIR/recall_journal_bench.XXXXXX/sessions.db)\n"
            "removed at the end; nothing else in DIR is touched (default: the\n"
            "temporary directory, $TMPDIR or /tmp)",
            [](auto& o) -> auto& { return o.dir; });
    return s;
  }();
  return f;
}

constexpr char kUsageHead[] =
    R"U(usage: recall_journal_bench [--tokens 1000,4000,16000] [--dir DIR]

What storing a streaming reply costs the SQLite session store: each reply written token by
token into a new session, once replacing the whole reply at every write (the baseline) and
once appending the token as a reply part. Prints, per reply length, the seconds for the whole
reply, the mean time of the last 100 writes, and the ratio baseline / parts.

options:
)U";

int Run(const Options& o, const std::string& dir) {
  auto store = coordinator::OpenStore(dir + "/sessions.db");
  if (!store.ok()) {
    std::fprintf(stderr, "%s\n", std::string(store.status().message()).c_str());
    return 1;
  }
  std::printf("reply tokens | replace whole: s, last ms/write | parts: s, last ms/write | ratio\n");
  int n = 0;
  for (const int tokens : o.tokens) {
    const absl::StatusOr<Timing> whole =
        WriteReply(**store, "w" + std::to_string(n), tokens, false);
    if (!whole.ok()) {
      std::fprintf(stderr, "write failed: %s\n", std::string(whole.status().message()).c_str());
      return 1;
    }
    const absl::StatusOr<Timing> parts = WriteReply(**store, "p" + std::to_string(n), tokens, true);
    if (!parts.ok()) {
      std::fprintf(stderr, "write failed: %s\n", std::string(parts.status().message()).c_str());
      return 1;
    }
    ++n;
    std::printf("%12d | %7.2f s, %6.3f ms | %7.2f s, %6.3f ms | %5.1fx\n", tokens, whole->total_s,
                whole->last_ms, parts->total_s, parts->last_ms, whole->total_s / parts->total_s);
  }
  return 0;
}

int Main(int argc, char** argv) {
  Options o;
  if (int rc = ParseBenchFlags(argc, argv, "recall_journal_bench", kUsageHead, JournalFlags(), &o);
      rc >= 0) {
    return rc;
  }
  std::string parent = o.dir;
  if (parent.empty()) {
    std::error_code ec;
    parent = std::filesystem::temp_directory_path(ec).string();
    if (ec) parent = "/tmp";
  }
  const absl::StatusOr<std::string> dir = MakeScratchDir("--dir", parent, "recall_journal_bench");
  if (!dir.ok()) {
    std::fprintf(stderr, "recall_journal_bench: %s\n", std::string(dir.status().message()).c_str());
    return dir.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  const int rc = Run(o, *dir);
  RemoveScratchDir(*dir);
  return rc;
}

}  // namespace
}  // namespace recall::bench

int main(int argc, char** argv) { return recall::bench::Main(argc, argv); }
