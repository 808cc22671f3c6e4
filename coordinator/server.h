// CoordinatorServer: the coordinator's gRPC server (recall.v1.Chat + grpc.health.v1), its
// OpenAI-compatible HTTP API (http_api.h, when http_listen is set), its session store, worker
// registry and metrics endpoint, started from one config. Both edges run turns through one
// Conversations and TurnRunner. Used by recall-coordinator and by `recall serve`.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/flags.h"
#include "common/metrics/http_server.h"
#include "coordinator/chat_service.h"
#include "coordinator/conversations.h"
#include "coordinator/http_api.h"
#include "coordinator/idle_sessions.h"
#include "coordinator/registry_service.h"
#include "grpcpp/grpcpp.h"

namespace recall::coordinator {

struct CoordinatorConfig {
  std::string listen = "127.0.0.1:50050";
  std::string http_listen;            // the OpenAI-compatible HTTP API; empty: off
  int http_threads = 512;             // HTTP connections served at once (a thread each)
  int completion_lease_seconds = 120;  // a keyed completion's claim while it runs (HttpOptions)
  double sse_keepalive_seconds = 15;   // a silent stream's keep-alive comment (HttpOptions)
  std::vector<std::string> workers;   // worker addresses
  std::string data_dir = ".";         // the SQLite file sessions.db lives here
  std::string store_url;              // "redis://HOST:PORT" for a shared store; empty: SQLite
  bool allow_volatile_store = false;  // a Redis without persistence: warn instead of refusing
  bool allow_store_loss = false;  // an SQLite store that lost sessions: warn instead of refusing
  std::string api_keys_path;          // empty: no auth (tenant "default")
  std::string cluster_token_file;     // the workers' and the registry's credential; empty: none
  int metrics_port = -1;              // -1: off; 0: any free port
  // TLS: PEM files, for gRPC and HTTP alike. With tls_client_ca, clients must present a
  // certificate it signed (mTLS).
  std::string tls_cert, tls_key, tls_client_ca;
  std::string port_file;  // the main writes "grpc=PORT metrics=PORT http=PORT" once listening
  // On SIGTERM or SIGINT, running turns get this long to end while no new one is taken
  // (Drain); a second signal ends them at once.
  double shutdown_grace_seconds = 25;
  CoordinatorOptions options;
};

class CoordinatorServer {
 public:
  // Unavailable when it cannot listen; errors from the store or the key file.
  static absl::StatusOr<std::unique_ptr<CoordinatorServer>> Start(const CoordinatorConfig& config);
  ~CoordinatorServer();

  int port() const { return port_; }
  int metrics_port() const { return http_ ? http_->port() : 0; }
  int http_port() const { return http_api_ ? http_api_->port() : 0; }
  WorkerRegistry& workers() { return *registry_; }
  // Stops taking turns (UNAVAILABLE, retryable: another replica takes them; health says
  // unavailable, so a load balancer stops sending them) and waits until the running turns
  // have ended, `grace` has passed, or `interrupted` (called about every 100 ms; it may wait
  // that long itself) says to stop waiting. Turns still running then are ended at once (they
  // streamed on for gRPC's 5 s shutdown grace); returns how many. Shutdown follows.
  int Drain(absl::Duration grace, const std::function<bool()>& interrupted);
  // Stops accepting calls; running gRPC streams get `grace` to finish, running HTTP turns are
  // cancelled.
  void Shutdown(std::chrono::milliseconds grace = std::chrono::seconds(5));
  // Reads the API key file again (recall-coordinator's SIGHUP): its keys replace those in use
  // for every call from now on (a key removed no longer works, one added does). An error
  // (no --api-keys, or a file that cannot be read or parsed) keeps the keys in use.
  absl::Status ReloadApiKeys();

 private:
  CoordinatorServer() = default;

  metrics::Registry metrics_;
  std::unique_ptr<SessionStore> store_;
  std::unique_ptr<WorkerRegistry> registry_;
  ApiKeys keys_ = ApiKeys::Open();
  std::string api_keys_path_;  // CoordinatorConfig::api_keys_path
  std::string cluster_token_;  // --cluster-token-file's token ("" none)
  // InvalidArgument when a key of `keys` is the cluster token.
  absl::Status CheckKeysApartFromToken(const ApiKeys& keys) const;
  std::unique_ptr<Conversations> conversations_;
  std::unique_ptr<IdleSessions> idle_sessions_;  // with --session-ttl
  std::unique_ptr<ChatService> service_;
  std::unique_ptr<RegistryService> registry_service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<metrics::HttpServer> http_;
  std::unique_ptr<HttpApi> http_api_;
  int port_ = 0;
};

// The limit flags (--max-message-bytes, --max-turns, --max-sessions), for recall-coordinator
// and recall serve alike.
const flags::FlagSet<CoordinatorOptions>& LimitFlags();

}  // namespace recall::coordinator
