#include "cli/chat_command.h"

#include <editline/readline.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <set>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "cli/connection.h"
#include "cli/sampling_flags.h"
#include "client/client.h"
#include "common/flags.h"
#include "common/status.h"
#include "worker/service/worker_options.h"

namespace recall::cli {
namespace {

// Ctrl-C while a reply streams: the count of SIGINTs since the reply began. A second one
// quits at once (the default action), as does one at the prompt (libedit's own handling).
volatile sig_atomic_t g_interrupts = 0;

void OnInterrupt(int) {
  g_interrupts = g_interrupts + 1;
  if (g_interrupts >= 2) {
    signal(SIGINT, SIG_DFL);
    raise(SIGINT);
  }
}

// Streams one reply to stdout; Ctrl-C cancels it. The reply's end (or CANCELLED).
// A reply's text as it streams in: escaped for a terminal, as the model wrote it for a program
// reading the output. (Each piece is whole UTF-8, so a C1 character is never split.)
std::string StreamedText(const std::string& text) {
  static const bool terminal = isatty(STDOUT_FILENO) == 1;
  return terminal ? Printable(text) : text;
}

// StreamReply's error when the user stopped the reply (Ctrl-C): said already, no error.
constexpr char kStoppedByUser[] = "stopped by the user";

absl::StatusOr<v1::ConverseDone> StreamReply(Client& client, const std::string& session_id,
                                             const std::string& message,
                                             const v1::SamplingParams& sampling) {
  std::unique_ptr<ReplyStream> reply = client.ConverseStream(session_id, message, sampling);
  g_interrupts = 0;
  struct sigaction on_int {
  }, previous{};
  on_int.sa_handler = OnInterrupt;
  sigemptyset(&on_int.sa_mask);
  sigaction(SIGINT, &on_int, &previous);
  std::atomic<bool> reading{true};
  // The handler only counts; this thread turns the first Ctrl-C into a cancel.
  std::thread watcher([&] {
    while (reading.load()) {
      if (g_interrupts > 0) {
        reply->Cancel();
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  std::string text;
  while (reply->Next(&text)) std::cout << StreamedText(text) << std::flush;
  reading = false;
  watcher.join();
  sigaction(SIGINT, &previous, nullptr);
  if (g_interrupts > 0) {
    // The server ends the turn a moment after the client: wait (bounded) until it has, so the
    // next message does not find the turn still running, and say what it recorded: a reply
    // that had already completed on the server (its last tokens still on their way) is kept
    // whole.
    v1::TurnState recorded = v1::TURN_STATE_IN_PROGRESS;
    for (int i = 0; i < 60; ++i) {
      absl::StatusOr<v1::Session> s = client.GetSession(session_id);
      if (!s.ok() || s->messages().empty()) break;
      recorded = s->messages().rbegin()->state();
      if (recorded != v1::TURN_STATE_IN_PROGRESS) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    switch (recorded) {
      case v1::TURN_STATE_INTERRUPTED:
        std::cout << "\n[stopped: the part above is kept in the session, marked interrupted]";
        break;
      case v1::TURN_STATE_IN_PROGRESS:
        std::cout << "\n[stopped: the server has not ended the turn yet; /history shows how "
                     "it is kept]";
        break;
      case v1::TURN_STATE_FAILED:
        std::cout << "\n[stopped: the turn failed on the server and is not in later prompts]";
        break;
      default:
        std::cout << "\n[stopped: the reply had already completed on the server and is kept "
                     "whole]";
        break;
    }
    std::cout << std::flush;
    return absl::CancelledError(kStoppedByUser);
  }
  if (!reply->status().ok()) return reply->status();
  return reply->done();
}

std::string HistoryFile() {
  const char* home = std::getenv("HOME");
  return home != nullptr && home[0] != '\0' ? std::string(home) + "/.recall_history" : "";
}

// One line of input: edited with history on a terminal (libedit), else read as is. False at
// the end of input.
bool ReadLine(bool tty, std::string* line) {
  if (!tty) {
    if (!std::getline(std::cin, *line)) return false;
    if (!line->empty() && line->back() == '\r') line->pop_back();  // CRLF input
    return true;
  }
  char* got = readline("> ");
  if (got == nullptr) {
    std::cout << "\n";
    return false;
  }
  *line = got;
  std::free(got);
  if (!line->empty()) {
    add_history(line->c_str());
    // Saved at once: Ctrl-C at the prompt ends the process there.
    if (const std::string file = HistoryFile(); !file.empty()) write_history(file.c_str());
  }
  return true;
}

constexpr char kChatUsageHead[] = R"(usage: recall chat --server HOST:PORT [options]

A multi-turn chat with a Recall coordinator. Interactive on a terminal; otherwise reads one
user message per line from standard input and prints each reply as it streams.
On a terminal, lines are edited and recalled as in a shell (libedit; history kept in
~/.recall_history); Ctrl-C stops a reply (the server keeps what was generated, marked
interrupted, out of later prompts), a second Ctrl-C or one at the prompt quits.
Commands (a line starting with /; never sent to the model):
  /new       start a new session       /history   print the transcript
  /stats     usage of the last reply   /help      list these commands
  /quit      leave (also /exit, /bye, end of input)
The session is created with the first message: a chat left without one leaves none behind.

)";

struct ChatOptions {
  ConnectOptions connect;
  std::string session;  // continue it instead of starting one
  std::string model;    // a new session's ("": the one the server serves)
  std::string system;
  int max_tokens = 256;
  std::vector<std::string> stop;  // extra stop strings (the chat format's are implied)
  SamplingFlags sampling;         // unset: the server's defaults
  serving::CacheRequest cache;  // a new session's cache settings
};

const flags::FlagSet<ChatOptions>& ChatFlags() {
  static const flags::FlagSet<ChatOptions>* const kFlags = [] {
    auto* f = new flags::FlagSet<ChatOptions>();
    f->Include(
         ConnectFlags(), [](auto& o) -> auto& { return o.connect; })
        .Section("chat")
        .Custom(
            "session", "ID", "continue an existing session instead of starting one",
            [](ChatOptions& o, absl::string_view v) {
              // (An empty id would start a new session, which the user did not ask for.)
              if (v.empty()) return absl::InvalidArgumentError("names no session (empty)");
              o.session = std::string(v);
              return absl::OkStatus();
            },
            [](const ChatOptions& o) {
              return o.session.empty() ? std::vector<std::string>{}
                                       : std::vector<std::string>{"--session", o.session};
            })
        .String(
            "model", "NAME",
            "model of a new session (required when the server serves several; default: the "
            "one it serves)",
            [](auto& o) -> auto& { return o.model; })
        .Text(
            "system", "TEXT", "system prompt of a new session",
            [](auto& o) -> auto& { return o.system; })
        .Int(
            "max-tokens", "N", "per reply (default 256)",
            [](auto& o) -> auto& { return o.max_tokens; }, 1, 1 << 20)
        .List(
            "stop", "TEXT",
            "end a reply where TEXT appears, leaving it out (repeatable; the chat format's own "
            "stops are implied)",
            [](auto& o) -> auto& { return o.stop; })
        .Include(
            SamplingFlagSet(), [](auto& o) -> auto& { return o.sampling; })
        .Include(
            service::SessionCacheFlags(), [](auto& o) -> auto& { return o.cache; })
        .Short('m', "model")
        .Short('n', "max-tokens")
        .Short('s', "seed");
    return f;
  }();
  return *kFlags;
}

// The settings the flags gave, as the wire's CacheSettings.
void ToProto(const serving::CacheRequest& c, v1::CacheSettings* out) {
  if (c.policy.has_value()) out->set_policy(*c.policy);
  if (c.budget_tokens.has_value()) out->set_budget_tokens(*c.budget_tokens);
  if (c.budget_fraction.has_value())
    out->set_budget_fraction(static_cast<float>(*c.budget_fraction));
  if (c.window.has_value()) out->set_window(*c.window);
  if (c.alpha.has_value()) out->set_alpha(static_cast<float>(*c.alpha));
  if (c.tp_eviction.has_value()) out->set_tp_eviction(*c.tp_eviction);
  if (c.episodes.has_value()) out->set_episodes(*c.episodes);
  if (c.embedder.has_value()) out->set_embedder(*c.embedder);
  if (c.block_tokens.has_value()) out->set_block_tokens(*c.block_tokens);
  if (c.recluster_turns.has_value()) out->set_recluster_turns(*c.recluster_turns);
  if (c.positions.has_value()) out->set_positions(*c.positions);
}

absl::Status Chat(const ChatOptions& o) {
  RECALL_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Connect(o.connect));
  v1::SamplingParams sampling;
  sampling.set_max_tokens(o.max_tokens);
  for (const std::string& stop : o.stop) sampling.add_stop(stop);
  ApplySampling(o.sampling, &sampling);
  v1::CreateSessionRequest create;
  create.set_model(o.model);
  create.set_system_prompt(o.system);
  ToProto(o.cache, create.mutable_cache());
  std::string session_id = o.session;
  if (!session_id.empty()) {
    // Continued: checked now, not at the first message; a new session's settings do not
    // apply to it.
    if (!o.model.empty() || !o.system.empty() || create.cache().ByteSizeLong() > 0) {
      return absl::InvalidArgumentError(
          "--session continues a session as it was made: --model, --system and the cache "
          "flags (--policy, --budget, ...) are for a new one");
    }
    absl::StatusOr<v1::Session> s = client->GetSession(session_id);
    if (!s.ok()) {
      absl::string_view why = s.status().message();
      absl::ConsumePrefix(&why, "session_id: ");
      return absl::Status(s.status().code(), absl::StrCat("--session: ", why));
    }
  }
  auto new_session = [&]() -> absl::Status {
    RECALL_ASSIGN_OR_RETURN(v1::Session s, client->CreateSession(create));
    session_id = s.session_id();
    std::cerr << "[session " << session_id << "]\n";
    // As recall generate says: budget flags a session that keeps every token ignores (the
    // server's default policy, when --policy is not given).
    serving::CacheDefaults kept;
    kept.policy = s.cache().policy();
    if (const std::string ignored = service::IgnoredBudgetFlags(o.cache, kept); !ignored.empty()) {
      std::cerr << "recall chat: warning: " << ignored
                << ": no effect: the session's policy is full"
                << (o.cache.policy.has_value() ? "" : " (the server's default)")
                << ", which keeps every token; give --policy (lazy+, lazy, ...) to evict\n";
    }
    return absl::OkStatus();
  };
  // Made with the first message, so a chat left without one leaves no session behind.
  const bool tty = isatty(STDIN_FILENO);
  v1::ConverseDone last;
  bool have_last = false;  // a reply ended (a replayed one has no worker)
  std::string line;
  const std::string history_file = tty ? HistoryFile() : "";
  if (!history_file.empty()) {
    using_history();
    read_history(history_file.c_str());  // none yet: fine
  }
  // Piped: a line the server refuses is reported and the next ones still go; the first such
  // error is the exit status.
  absl::Status refused = absl::OkStatus();
  while (true) {
    if (!ReadLine(tty, &line)) break;
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    if (line[0] == '/') {
      // A command, never a message: its word, and nothing after it.
      const std::string word = line.substr(0, line.find(' '));
      static const std::set<std::string> kCommands = {"/quit", "/exit",    "/bye",  "/help",
                                                      "/new",  "/history", "/stats"};
      std::string wrong;
      if (kCommands.count(word) == 0) {
        wrong = absl::StrCat("unknown command ", word,
                             " (/help lists them; a message that starts with / is sent with a "
                             "space before it)");
      } else if (!absl::StripAsciiWhitespace(line.substr(word.size())).empty()) {
        wrong = absl::StrCat(word, " takes nothing after it");
      }
      if (!wrong.empty()) {
        std::cerr << "recall chat: " << wrong << "\n";
        if (refused.ok() && !tty) refused = absl::InvalidArgumentError(wrong);
        continue;
      }
      line = word;
    }
    if (line == "/quit" || line == "/exit" || line == "/bye") break;
    if (line == "/help") {
      std::cout << "/new /history /stats /help /quit (/exit, /bye)\n";
      continue;
    }
    if (line == "/new") {
      session_id.clear();  // the next message starts it
      last.Clear();
      have_last = false;
      continue;
    }
    if (line == "/history") {
      if (session_id.empty()) {
        std::cout << "(no messages yet)\n";
        continue;
      }
      absl::StatusOr<v1::Session> s = client->GetSession(session_id);
      if (!s.ok()) {
        std::cerr << "recall chat: /history: " << s.status().message() << "\n";
        continue;
      }
      for (const v1::ChatMessage& m : s->messages())
        std::cout << m.role() << StateNote(m) << ": " << Printable(m.content()) << "\n";
      continue;
    }
    if (line == "/stats") {
      if (!have_last) {  // (all zeros, and "worker ," before)
        std::cout << "no reply has ended yet\n";
        continue;
      }
      std::cout << "prompt " << last.usage().prompt_tokens() << " (cached "
                << last.usage().cached_tokens() << "), generated "
                << last.usage().generated_tokens() << ", KV " << last.kv_bytes()
                << " bytes (policy state " << last.state_bytes() << ", peak "
                << last.peak_kv_bytes() << "), evictions " << last.evictions() << ", worker "
                << last.worker() << ", failovers " << last.failovers() << "\n";
      if (last.has_episodes()) {
        std::cout << "episodes " << last.episodes().windows_size() << " (windows:";
        for (int w : last.episodes().windows()) std::cout << " " << w;
        std::cout << "), answered by episode " << last.episodes().active() << ", replayed "
                  << last.episodes().replayed_tokens() << " tokens\n";
      }
      continue;
    }
    const bool first_turn = session_id.empty();
    if (first_turn) {
      if (absl::Status made = new_session(); !made.ok()) {
        made = InFlagTerms(made);
        if (!tty) return made;
        std::cerr << "recall chat: the message was not sent: " << made.message()
                  << " (it is in the line history: press Up to send it again)\n";
        continue;
      }
    }
    // Piped: a transcript. "assistant:" comes with the reply's first text (or its end), so a
    // turn the server refuses shows no empty reply before the error.
    if (!tty) std::cout << "user: " << line << "\n" << std::flush;
    bool replied = tty;
    auto reply_starts = [&] {
      if (!replied) std::cout << "assistant:";
      replied = true;
    };
    absl::StatusOr<v1::ConverseDone> done =
        tty ? StreamReply(*client, session_id, line, sampling)
            : client->Converse(session_id, line, sampling, [&](const std::string& text) {
                reply_starts();
                std::cout << StreamedText(text) << std::flush;
              });
    if (done.ok()) reply_starts();
    if (replied) std::cout << "\n" << std::flush;
    if (!done.ok()) {
      done = InFlagTerms(done.status());
      // A first message the server did not take (refused, or no worker had room) leaves no
      // session behind, as a chat left without one; a turn that stored anything (a reply cut
      // short) is kept in its session.
      if (first_turn) {
        absl::StatusOr<v1::Session> made = client->GetSession(session_id);
        if (made.ok() &&
            std::all_of(made->messages().begin(), made->messages().end(),
                        [](const v1::ChatMessage& m) { return m.role() == "system"; })) {
          if (const absl::Status gone = client->DeleteSession(session_id); gone.ok()) {
            std::cerr << "[session " << session_id
                      << " removed: its first message was not taken]\n";
            session_id.clear();
          } else {
            std::cerr << "[session " << session_id << " kept: it could not be removed ("
                      << gone.message() << ")]\n";
          }
        }
      }
      const absl::StatusCode code = done.status().code();
      if (tty && code == absl::StatusCode::kCancelled &&
          done.status().message() == kStoppedByUser) {
        continue;  // said already
      }
      const bool this_line =
          code == absl::StatusCode::kInvalidArgument || code == absl::StatusCode::kOutOfRange;
      if (!tty && !this_line) return done.status();  // reported by the caller, with the code
      std::cerr << "recall chat: " << done.status().message() << "\n";
      if (refused.ok() && !tty) refused = done.status();
      continue;
    }
    last = *done;
    have_last = true;
  }
  if (!refused.ok()) {  // a usage error's status, 2, whatever refused the line
    return absl::InvalidArgumentError(
        absl::StrCat("a line was refused (above): ", refused.message()));
  }
  return absl::OkStatus();
}

}  // namespace

int RunChat(const std::vector<std::string>& argv) {
  for (const std::string& a : argv) {
    if (a == "--help" || a == "-h") {
      std::cout << kChatUsageHead << ChatFlags().Help();
      return 0;
    }
  }
  ChatOptions options;
  if (absl::Status st = ChatFlags().Parse(argv, &options); !st.ok()) {
    std::cerr << "recall chat: " << st.message() << " (recall chat --help lists the flags)\n";
    return 2;
  }
  return Report("chat", Chat(options), nullptr);
}

}  // namespace recall::cli
