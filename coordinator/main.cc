// recall-coordinator: the public Chat API in front of one or more recall-workers.
#include <algorithm>
#include <cstdio>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/files.h"
#include "common/flags.h"
#include "common/grpc/quiet_handshakes.h"
#include "common/status.h"
#include "common/stop_signals.h"
#include "coordinator/server.h"

namespace recall::coordinator {
namespace {

constexpr char kUsageHead[] =
    R"(usage: recall-coordinator [--workers HOST:PORT[,HOST:PORT...]] [options]

Serves recall.v1.Chat (sessions, Converse, Generate, ListModels) and grpc.health.v1 (and,
with --http-listen, the OpenAI-compatible HTTP API), routes each session to a worker, stores
transcripts in SQLite and fails turns over when a worker dies.

)";

const flags::FlagSet<CoordinatorConfig>& CoordinatorFlags() {
  static const flags::FlagSet<CoordinatorConfig>* const kFlags = [] {
    auto* f = new flags::FlagSet<CoordinatorConfig>();
    f->Section("coordinator")
        .Custom(
            "workers", "LIST",
            "worker addresses, comma separated (workers started with --coordinator register\n"
            "themselves as well)",
            [](CoordinatorConfig& c, absl::string_view v) {
              for (absl::string_view w : absl::StrSplit(v, ',')) {
                // A worker listens on a port of its own: HOST:PORT, the port not 0. (The
                // messages leave the flag's name to the parser, which puts it first.)
                if (w.empty()) {
                  return absl::InvalidArgumentError(
                      absl::StrCat("an empty address in \"", v, "\" (HOST:PORT,HOST:PORT)"));
                }
                absl::StatusOr<std::pair<std::string, int>> host_port =
                    flags::SplitHostPort("workers", std::string(w));
                if (!host_port.ok()) {
                  return absl::InvalidArgumentError(flags::FieldWhat(host_port.status()));
                }
                if (host_port->first.empty() || host_port->second == 0) {
                  return absl::InvalidArgumentError(absl::StrCat(
                      "expected HOST:PORT with a port in [1, 65535], got \"", w, "\""));
                }
                if (std::find(c.workers.begin(), c.workers.end(), w) != c.workers.end()) {
                  // (It was counted as two workers, and failed over onto itself.)
                  return absl::InvalidArgumentError(absl::StrCat("\"", w, "\" is listed twice"));
                }
                c.workers.emplace_back(w);
              }
              return absl::OkStatus();
            },
            [](const CoordinatorConfig&) { return std::vector<std::string>{}; })
        .String(
            "listen", "HOST:PORT", "gRPC address (default 127.0.0.1:50050; port 0 picks one)",
            [](auto& o) -> auto& { return o.listen; })
        .Custom(
            "http-listen", "HOST:PORT",
            "OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions, /v1/models,\n"
            "/health); default off (as is \"off\", recall serve's word); port 0 picks one;\n"
            "HTTPS with --tls-cert",
            [](CoordinatorConfig& c, absl::string_view v) -> absl::Status {
              if (v.empty()) return absl::InvalidArgumentError(flags::kEmptyValue);
              c.http_listen = v == "off" ? "" : std::string(v);
              return absl::OkStatus();
            },
            [](const CoordinatorConfig& c) {
              return c.http_listen.empty()
                         ? std::vector<std::string>{}
                         : std::vector<std::string>{"--http-listen", c.http_listen};
            })
        .Int(
            "http-threads", "N",
            "HTTP connections served at once, each on its own thread while it is open\n"
            "(default 512); more wait for one to close",
            [](auto& o) -> auto& { return o.http_threads; }, 1, 4096)
        .Int(
            "completion-lease", "SECONDS",
            "how long a keyed completion (Idempotency-Key) stays claimed by the coordinator\n"
            "running it without a renewal; renewed while it runs, silent or not; another\n"
            "coordinator resumes it after (default 120)",
            [](auto& o) -> auto& { return o.completion_lease_seconds; }, 1, 86400)
        .Double(
            "sse-keepalive", "SECONDS",
            "a stream silent this long gets an SSE comment line (\": keep-alive\"), so\n"
            "proxies keep it open and a client that left is noticed (default 15); before its\n"
            "first token a stream begins after a second, or this if shorter, and gets a\n"
            "comment that often",
            [](auto& o) -> auto& { return o.sse_keepalive_seconds; }, 0.001, 3600)
        .Double(
            "shutdown-grace", "SECONDS",
            "on SIGTERM or SIGINT, running turns get this long to end while no new turn is\n"
            "taken and health says unavailable (default 25: within Kubernetes' 30 s); a\n"
            "second signal ends them at once",
            [](auto& o) -> auto& { return o.shutdown_grace_seconds; }, 0, 86400)
        .String(
            "data-dir", "DIR", "where sessions.db lives (default .)",
            [](auto& o) -> auto& { return o.data_dir; })
        .String(
            "store", "URL",
            "redis://HOST[:PORT] to share sessions between coordinator replicas (run Redis\n"
            "with appendonly yes, appendfsync always), or sqlite://PATH; default SQLite in\n"
            "--data-dir",
            [](auto& o) -> auto& { return o.store_url; })
        .Field("store_url")
        .Switch(
            "allow-volatile-store",
            "start even when the --store Redis keeps nothing on disk (appendonly no, no\n"
            "save points), with a warning; by default the coordinator refuses to start",
            [](auto& o) -> auto& { return o.allow_volatile_store; })
        .Switch(
            "allow-store-loss",
            "start on an SQLite store that lost sessions (a damaged sessions.db-wal or page,\n"
            "a file emptied to 0 bytes), serving what can be read, with a warning; by default\n"
            "the coordinator refuses to start, before anything is written to the file",
            [](auto& o) -> auto& { return o.allow_store_loss; })
        .String(
            "api-keys", "FILE",
            "\"<key> <tenant>\" per line; without it every caller is tenant \"default\"",
            [](auto& o) -> auto& { return o.api_keys_path; })
        .String(
            "cluster-token-file", "PATH",
            "the cluster token: presented to the workers, and the only credential\n"
            "recall.v1.Registry accepts (default: none; the registry is then open, or closed\n"
            "when --api-keys is on)",
            [](auto& o) -> auto& { return o.cluster_token_file; })
        .Int(
            "metrics-port", "N", "Prometheus /metrics (default off; 0 picks a free port)",
            [](auto& o) -> auto& { return o.metrics_port; }, 0, 65535)
        .String(
            "tls-cert", "FILE", "serve TLS with this certificate (PEM; with --tls-key)",
            [](auto& o) -> auto& { return o.tls_cert; })
        .String(
            "tls-key", "FILE", "the certificate's key (PEM)",
            [](auto& o) -> auto& { return o.tls_key; })
        .String(
            "tls-client-ca", "FILE", "require client certificates signed by this CA (mTLS)",
            [](auto& o) -> auto& { return o.tls_client_ca; })
        .Custom(
            "port-file", "PATH", "write \"grpc=PORT metrics=PORT http=PORT\" once listening",
            [](CoordinatorConfig& c, absl::string_view v) {
              if (v.empty()) return absl::InvalidArgumentError(flags::kEmptyValue);
              c.port_file = std::string(v);
              return absl::OkStatus();
            },
            [](const CoordinatorConfig&) { return std::vector<std::string>{}; })
        .Include(
            LimitFlags(), [](auto& o) -> auto& { return o.options; })
        .Int(
            "turn-lease", "SECONDS",
            "how long a session turn in progress stays claimed by the coordinator running it\n"
            "without a write; renewed while it runs, silent or not; replicas sharing a Redis\n"
            "store read a lapsed one as interrupted, resumable (default 60)",
            [](auto& o) -> auto& { return o.options.turn_lease_seconds; }, 1, 86400)
        .Check([](const CoordinatorConfig& c, const std::set<std::string>&) -> absl::Status {
          if (c.tls_cert.empty() != c.tls_key.empty()) {
            return absl::InvalidArgumentError("--tls-cert and --tls-key go together");
          }
          if (!c.tls_client_ca.empty() && c.tls_cert.empty()) {
            return absl::InvalidArgumentError("--tls-client-ca needs --tls-cert and --tls-key");
          }
          if (!c.store_url.empty()) RECALL_RETURN_IF_ERROR(CheckStoreUrl(c.store_url));
          return absl::OkStatus();
        });
    return f;
  }();
  return *kFlags;
}

absl::Status Run(const std::vector<std::string>& argv) {
  for (const std::string& a : argv) {
    if (a == "--help" || a == "-h") {
      std::cout << kUsageHead << CoordinatorFlags().Help();
      return absl::OkStatus();
    }
  }
  CoordinatorConfig c;
  RECALL_RETURN_IF_ERROR(CoordinatorFlags().Parse(argv, &c));

  StopSignals stop(/*hangup=*/true);  // before any thread starts
  grpcutil::QuietHandshakeLogs();
  absl::StatusOr<std::unique_ptr<CoordinatorServer>> started = CoordinatorServer::Start(c);
  if (!started.ok()) return CoordinatorFlags().Explain(started.status());
  std::unique_ptr<CoordinatorServer> server = std::move(*started);
  std::fprintf(stderr, "recall-coordinator: serving on %s (port %d%s), %zu worker(s), store %s\n",
               c.listen.c_str(), server->port(),
               c.tls_cert.empty()        ? ", plaintext"
               : c.tls_client_ca.empty() ? ", TLS"
                                         : ", TLS with client certificates",
               c.workers.size(),
               c.store_url.empty() ? (c.data_dir + "/sessions.db").c_str() : c.store_url.c_str());
  if (server->http_port() > 0) {
    const std::string host = c.http_listen.substr(0, c.http_listen.rfind(':'));
    std::fprintf(stderr, "recall-coordinator: OpenAI-compatible HTTP API on %s://%s:%d/v1\n",
                 c.tls_cert.empty() ? "http" : "https", host.c_str(), server->http_port());
  }
  if (c.cluster_token_file.empty()) {
    std::fprintf(stderr, "recall-coordinator: WARNING: no --cluster-token-file; %s\n",
                 c.api_keys_path.empty()
                     ? "recall.v1.Registry takes Register and Drain from anyone who can reach it"
                     : "recall.v1.Registry is closed (API keys are on), and the workers' ports "
                       "need their own protection");
  }
  if (c.api_keys_path.empty()) {
    // Every caller is then the one tenant "default": said where others can reach the ports.
    std::vector<std::string> open;
    for (const std::string& address : {c.listen, c.http_listen}) {
      if (address.empty()) continue;
      const std::string host = address.substr(0, address.rfind(':'));
      if (host != "127.0.0.1" && host != "localhost" && host != "[::1]" && host != "::1") {
        open.push_back(address);
      }
    }
    if (!open.empty()) {
      std::fprintf(stderr,
                   "recall-coordinator: WARNING: no --api-keys, and %s takes calls from other "
                   "machines: every caller is the tenant \"default\" and can read, continue and "
                   "delete every session\n",
                   absl::StrJoin(open, " and ").c_str());
    }
  }
  if (!c.port_file.empty()) {
    const absl::Status written = WritePortFile(
        c.port_file, absl::StrCat("grpc=", server->port(), " metrics=", server->metrics_port(),
                                  " http=", server->http_port(), "\n"));
    if (!written.ok()) {
      server->Shutdown();
      return written;
    }
  }
  int sig;
  while ((sig = stop.Wait()) == SIGHUP) {  // the API keys read again
    if (const absl::Status reloaded = server->ReloadApiKeys(); reloaded.ok()) {
      std::fprintf(stderr, "recall-coordinator: SIGHUP: %s read again\n", c.api_keys_path.c_str());
    } else {
      std::fprintf(stderr, "recall-coordinator: SIGHUP: %s\n",
                   std::string(reloaded.message()).c_str());
    }
  }
  std::fprintf(stderr, "recall-coordinator: signal %d, shutting down\n", sig);
  const int left = server->Drain(absl::Seconds(c.shutdown_grace_seconds), [&stop] {
    const int again = stop.Wait(absl::Milliseconds(100));
    return again != 0 && again != SIGHUP;  // a second stop
  });
  if (left > 0) std::fprintf(stderr, "recall-coordinator: ending %d running turn(s)\n", left);
  stop.Ignore();
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
