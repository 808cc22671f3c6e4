#include "cli/chat_command.h"

#include <unistd.h>

#include <fstream>
#include <iostream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "client/client.h"
#include "common/args.h"
#include "common/status.h"

namespace recall::cli {
namespace {

constexpr char kChatUsage[] = R"(usage: recall chat --server HOST:PORT [options]

A multi-turn chat with a Recall coordinator. Interactive on a terminal; otherwise reads one
user message per line from standard input and prints each reply as it streams.

  --server HOST:PORT    the coordinator (default 127.0.0.1:50050)
  --api-key KEY         sent as "authorization: Bearer KEY"
  --tls-ca FILE         connect with TLS, trusting this CA (PEM)
  --tls-cert FILE, --tls-key FILE   client certificate for mTLS
  --session ID          continue an existing session instead of starting one
  --system TEXT         system prompt of a new session
  --max-tokens N        per reply (default 256)
  --temperature T       default 0.7 (0 = greedy)
  --seed N              sampling seed
  --policy NAME         KV policy of a new session (e.g. lazy, episodic), with --budget N
                        (tokens) or --budget-frac F, --window W; episodic: --episodes N,
                        --embedder model|tfidf
commands (a line starting with /):
  /new       start a new session       /history   print the transcript
  /stats     usage of the last reply   /quit      leave (also end of input)
)";

constexpr char kSessionsUsage[] =
    R"(usage: recall sessions list|show ID|delete ID --server HOST:PORT [--api-key KEY]
                       [--tls-ca FILE [--tls-cert FILE --tls-key FILE]]
)";

absl::StatusOr<std::string> ReadPem(const Args& args, const std::string& flag) {
  if (!args.Has(flag)) return std::string();
  std::ifstream in(args.GetString(flag), std::ios::binary);
  if (!in)
    return absl::NotFoundError(absl::StrCat("--", flag, ": cannot read ", args.GetString(flag)));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::StatusOr<std::unique_ptr<Client>> ConnectFromArgs(const Args& args) {
  ClientOptions o;
  o.address = args.GetString("server", "127.0.0.1:50050");
  o.api_key = args.GetString("api-key");
  if (args.Has("tls-ca") || args.Has("tls-cert")) {
    grpc::SslCredentialsOptions ssl;
    RECALL_ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadPem(args, "tls-ca"));
    RECALL_ASSIGN_OR_RETURN(ssl.pem_cert_chain, ReadPem(args, "tls-cert"));
    RECALL_ASSIGN_OR_RETURN(ssl.pem_private_key, ReadPem(args, "tls-key"));
    o.credentials = grpc::SslCredentials(ssl);
  }
  return Client::Connect(o);
}

absl::Status Chat(const Args& args) {
  RECALL_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, ConnectFromArgs(args));
  v1::SamplingParams sampling;
  RECALL_ASSIGN_OR_RETURN(const int64_t max_tokens, args.GetInt("max-tokens", 256, 1, 1 << 20));
  RECALL_ASSIGN_OR_RETURN(const double temperature, args.GetDouble("temperature", 0.7, 0, 100));
  sampling.set_max_tokens(static_cast<int>(max_tokens));
  sampling.set_temperature(static_cast<float>(temperature));
  if (args.Has("seed")) {
    RECALL_ASSIGN_OR_RETURN(const int64_t seed, args.GetInt("seed", 0, 0, INT64_MAX));
    sampling.set_seed(static_cast<uint64_t>(seed));
  }
  v1::CreateSessionRequest create;
  create.set_system_prompt(args.GetString("system"));
  if (args.Has("policy")) create.mutable_cache()->set_policy(args.GetString("policy"));
  if (args.Has("budget") && args.Has("budget-frac")) {
    return absl::InvalidArgumentError("--budget and --budget-frac are exclusive; give one");
  }
  if (args.Has("budget")) {
    RECALL_ASSIGN_OR_RETURN(const int64_t b, args.GetInt("budget", 1024, 1, 1 << 24));
    create.mutable_cache()->set_budget_tokens(static_cast<int>(b));
  }
  if (args.Has("episodes")) {
    RECALL_ASSIGN_OR_RETURN(const int64_t e, args.GetInt("episodes", 4, 1, 16));
    create.mutable_cache()->set_episodes(static_cast<int>(e));
  }
  if (args.Has("embedder")) create.mutable_cache()->set_embedder(args.GetString("embedder"));
  if (args.Has("budget-frac")) {
    RECALL_ASSIGN_OR_RETURN(const double f, args.GetDouble("budget-frac", 1, 1e-6, 1));
    create.mutable_cache()->set_budget_fraction(static_cast<float>(f));
  }
  if (args.Has("window")) {
    RECALL_ASSIGN_OR_RETURN(const int64_t w, args.GetInt("window", 32, 1, 1 << 20));
    create.mutable_cache()->set_window(static_cast<int>(w));
  }
  std::string session_id = args.GetString("session");
  auto new_session = [&]() -> absl::Status {
    RECALL_ASSIGN_OR_RETURN(v1::Session s, client->CreateSession(create));
    session_id = s.session_id();
    std::cerr << "[session " << session_id << "]\n";
    return absl::OkStatus();
  };
  if (session_id.empty()) {
    RECALL_RETURN_IF_ERROR(new_session());
  }
  const bool tty = isatty(STDIN_FILENO);
  v1::ConverseDone last;
  std::string line;
  while (true) {
    if (tty) std::cout << "> " << std::flush;
    if (!std::getline(std::cin, line)) break;
    if (line.empty()) continue;
    if (line == "/quit") break;
    if (line == "/new") {
      RECALL_RETURN_IF_ERROR(new_session());
      continue;
    }
    if (line == "/history") {
      RECALL_ASSIGN_OR_RETURN(v1::Session s, client->GetSession(session_id));
      for (const v1::ChatMessage& m : s.messages())
        std::cout << m.role() << ": " << m.content() << "\n";
      continue;
    }
    if (line == "/stats") {
      std::cout << "prompt " << last.usage().prompt_tokens() << " (cached "
                << last.usage().cached_tokens() << "), generated "
                << last.usage().generated_tokens() << ", KV " << last.kv_bytes()
                << " bytes, evictions " << last.evictions() << ", worker " << last.worker()
                << ", failovers " << last.failovers() << "\n";
      if (last.has_episodes()) {
        std::cout << "episodes " << last.episodes().windows_size() << " (windows:";
        for (int w : last.episodes().windows()) std::cout << " " << w;
        std::cout << "), answered by episode " << last.episodes().active() << ", replayed "
                  << last.episodes().replayed_tokens() << " tokens\n";
      }
      continue;
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
        client->Converse(session_id, line, sampling, [&](const std::string& text) {
          reply_starts();
          std::cout << text << std::flush;
        });
    if (done.ok()) reply_starts();
    if (replied) std::cout << "\n" << std::flush;
    if (!done.ok()) {
      if (!tty) return done.status();  // reported once, by the caller, with the exit code
      std::cerr << "recall chat: " << done.status().message() << "\n";
      continue;
    }
    last = *done;
  }
  return absl::OkStatus();
}

absl::Status Sessions(const Args& args) {
  RECALL_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, ConnectFromArgs(args));
  const std::vector<std::string>& pos = args.positional();
  const std::string verb = pos.empty() ? "list" : pos[0];
  if (verb == "list") {
    std::string token;
    do {
      RECALL_ASSIGN_OR_RETURN(v1::ListSessionsResponse page, client->ListSessions(100, token));
      for (const v1::Session& s : page.sessions()) {
        std::cout << s.session_id() << "  " << s.model() << "  turns=" << s.turns() << "\n";
      }
      token = page.next_page_token();
    } while (!token.empty());
    return absl::OkStatus();
  }
  if (pos.size() != 2)
    return absl::InvalidArgumentError(absl::StrCat(verb, ": needs a session id"));
  if (verb == "show") {
    RECALL_ASSIGN_OR_RETURN(v1::Session s, client->GetSession(pos[1]));
    std::cout << s.DebugString();
    return absl::OkStatus();
  }
  if (verb == "delete") return client->DeleteSession(pos[1]);
  return absl::InvalidArgumentError(absl::StrCat("unknown sessions command \"", verb, "\""));
}

// `usage` is printed after an invalid command line; null for errors of the run itself (a
// server's INVALID_ARGUMENT is about the request, not the flags).
int Report(const char* name, const absl::Status& st, const char* usage) {
  if (st.ok()) return 0;
  std::cerr << "recall " << name << ": " << st.message() << "\n";
  if (usage != nullptr && st.code() == absl::StatusCode::kInvalidArgument) {
    std::cerr << "\n" << usage;
  }
  return st.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
}

}  // namespace

int RunChat(const std::vector<std::string>& argv) {
  absl::StatusOr<Args> args = Args::Parse(
      argv,
      {"server", "api-key", "tls-ca", "tls-cert", "tls-key", "session", "system", "max-tokens",
       "temperature", "seed", "policy", "budget", "budget-frac", "window", "episodes", "embedder"},
      {"help"});
  if (!args.ok()) return Report("chat", args.status(), kChatUsage);
  if (args->Has("help")) {
    std::cout << kChatUsage;
    return 0;
  }
  return Report("chat", Chat(*args), nullptr);
}

int RunSessions(const std::vector<std::string>& argv) {
  absl::StatusOr<Args> args =
      Args::Parse(argv, {"server", "api-key", "tls-ca", "tls-cert", "tls-key"}, {"help"});
  if (!args.ok()) return Report("sessions", args.status(), kSessionsUsage);
  if (args->Has("help")) {
    std::cout << kSessionsUsage;
    return 0;
  }
  return Report("sessions", Sessions(*args), kSessionsUsage);
}

}  // namespace recall::cli
