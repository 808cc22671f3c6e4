// recall-coordinator: the public Chat API in front of one or more recall-workers.
#include <signal.h>

#include <cstdio>
#include <fstream>
#include <iostream>

#include "absl/strings/str_split.h"
#include "common/args.h"
#include "common/status.h"
#include "coordinator/server.h"

namespace recall::coordinator {
namespace {

constexpr char kUsage[] = R"(usage: recall-coordinator [--workers HOST:PORT[,HOST:PORT...]] [options]

Serves recall.v1.Chat (sessions, Converse, Generate, ListModels) and grpc.health.v1, routes
each session to a worker, stores transcripts in SQLite and fails turns over when a worker dies.

  --workers LIST          worker addresses, comma separated (workers started with
                          --coordinator register themselves as well)
  --listen HOST:PORT      gRPC address (default 127.0.0.1:50050; port 0 picks one)
  --data-dir DIR          where sessions.db lives (default .)
  --store URL             redis://HOST:PORT to share sessions between coordinator replicas
                          (run Redis with appendonly yes, appendfsync always); default SQLite
  --api-keys FILE         "<key> <tenant>" per line; without it every caller is tenant "default"
  --metrics-port N        Prometheus /metrics (default off; 0 picks a free port)
  --tls-cert FILE, --tls-key FILE   serve TLS (PEM)
  --tls-client-ca FILE    require client certificates signed by this CA (mTLS)
  --port-file PATH        write "grpc=PORT metrics=PORT" once listening
  --max-message-bytes N   user message / system prompt limit (default 262144)
  --max-turns N           exchanges per session (default 10000)
  --max-sessions N        sessions per tenant (default 100000)
)";

absl::Status Run(const std::vector<std::string>& argv) {
  RECALL_ASSIGN_OR_RETURN(
      const Args args,
      Args::Parse(argv,
                  {"workers", "listen", "data-dir", "store", "api-keys", "tls-cert", "tls-key", "tls-client-ca", "metrics-port", "port-file",
                   "max-message-bytes", "max-turns", "max-sessions"},
                  {"help"}));
  if (args.Has("help")) {
    std::cout << kUsage;
    return absl::OkStatus();
  }
  CoordinatorConfig c;
  c.listen = args.GetString("listen", c.listen);
  for (absl::string_view w : absl::StrSplit(args.GetString("workers"), ',', absl::SkipEmpty())) {
    c.workers.emplace_back(w);
  }
  // Workers may also register themselves (recall-worker --coordinator).
  c.data_dir = args.GetString("data-dir", ".");
  c.store_url = args.GetString("store");
  c.tls_cert = args.GetString("tls-cert");
  c.tls_key = args.GetString("tls-key");
  c.tls_client_ca = args.GetString("tls-client-ca");
  if (c.tls_cert.empty() != c.tls_key.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together");
  }
  if (!c.tls_client_ca.empty() && c.tls_cert.empty()) {
    return absl::InvalidArgumentError("--tls-client-ca needs --tls-cert and --tls-key");
  }
  c.api_keys_path = args.GetString("api-keys");
  if (args.Has("metrics-port")) {
    RECALL_ASSIGN_OR_RETURN(const int64_t p, args.GetInt("metrics-port", 0, 0, 65535));
    c.metrics_port = static_cast<int>(p);
  }
  RECALL_ASSIGN_OR_RETURN(const int64_t mb, args.GetInt("max-message-bytes", 262144, 1, 64 << 20));
  RECALL_ASSIGN_OR_RETURN(const int64_t turns, args.GetInt("max-turns", 10000, 1, 1 << 30));
  RECALL_ASSIGN_OR_RETURN(const int64_t sessions, args.GetInt("max-sessions", 100000, 1, 1 << 30));
  c.options.max_message_bytes = static_cast<size_t>(mb);
  c.options.max_turns = static_cast<int>(turns);
  c.options.max_sessions_per_tenant = static_cast<int>(sessions);

  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  RECALL_ASSIGN_OR_RETURN(std::unique_ptr<CoordinatorServer> server, CoordinatorServer::Start(c));
  std::fprintf(stderr, "recall-coordinator: serving on %s (port %d), %zu worker(s), store %s\n",
               c.listen.c_str(), server->port(), c.workers.size(),
               c.store_url.empty() ? (c.data_dir + "/sessions.db").c_str() : c.store_url.c_str());
  if (args.Has("port-file")) {
    const std::string path = args.GetString("port-file");
    {
      std::ofstream out(path + ".tmp");
      out << "grpc=" << server->port() << " metrics=" << server->metrics_port() << "\n";
    }
    std::rename((path + ".tmp").c_str(), path.c_str());
  }
  int sig = 0;
  sigwait(&signals, &sig);
  std::fprintf(stderr, "recall-coordinator: signal %d, shutting down\n", sig);
  server->Shutdown();
  return absl::OkStatus();
}

}  // namespace
}  // namespace recall::coordinator

int main(int argc, char** argv) {
  const absl::Status st =
      recall::coordinator::Run(std::vector<std::string>(argv + 1, argv + argc));
  if (!st.ok()) {
    std::fprintf(stderr, "recall-coordinator: %s\n", std::string(st.message()).c_str());
    return st.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}
