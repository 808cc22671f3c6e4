#include "coordinator/server.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "common/flags.h"
#include "common/grpc/server_start.h"
#include "common/grpc/status_interceptor.h"
#include "common/logging.h"
#include "common/status.h"
#include "common/tls/certificate.h"
#include "coordinator/turn_runner.h"

namespace recall::coordinator {

absl::StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    const CoordinatorConfig& config) {
  std::unique_ptr<CoordinatorServer> s(new CoordinatorServer());
  std::error_code ec;
  // Made the owner's only: it holds the session store (every tenant's transcripts).
  if (std::filesystem::create_directories(config.data_dir, ec) && !ec) {
    std::filesystem::permissions(config.data_dir, std::filesystem::perms::owner_all,
                                 std::filesystem::perm_options::replace, ec);
  }
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("--data-dir: cannot create ", config.data_dir, ": ", ec.message()));
  }
  RECALL_ASSIGN_OR_RETURN(
      s->store_,
      OpenStore(config.store_url.empty() ? config.data_dir + "/sessions.db" : config.store_url,
                StoreRisks{.allow_volatile = config.allow_volatile_store,
                           .allow_loss = config.allow_store_loss}));
  // Turns a previous run left streaming: their writer is gone, so they were interrupted. A
  // damaged store (said as it opened) is served as far as it can be read: where this cannot
  // be done, a turn in progress that no turn here runs is taken as interrupted anyway
  // (Conversations::OwnOrphan: a store that keeps no writer, as SQLite).
  absl::StatusOr<int> interrupted = s->store_->InterruptInProgress();
  if (interrupted.status().code() == absl::StatusCode::kDataLoss) {
    RECALL_LOG(WARNING) << interrupted.status().message()
                        << "; a turn a previous run left streaming is taken as interrupted when "
                           "its session is next used";
    interrupted = 0;
  }
  RECALL_RETURN_IF_ERROR(interrupted.status());
  if (*interrupted > 0) {
    std::fprintf(stderr,
                 "recall-coordinator: %d turn(s) were streaming when the last run stopped; "
                 "marked interrupted (their partial replies are kept)\n",
                 *interrupted);
  }
  if (!config.api_keys_path.empty()) {
    RECALL_ASSIGN_OR_RETURN(s->keys_, ApiKeys::Load(config.api_keys_path));
    s->api_keys_path_ = config.api_keys_path;
    if (s->keys_.tenants() > 1 && config.options.max_running_per_tenant == 0) {
      std::fprintf(stderr,
                   "recall-coordinator: WARNING: %zu tenants share the workers with no "
                   "--max-running-per-tenant: one tenant's burst of turns can fill every "
                   "worker's queue and leave the others refused\n",
                   s->keys_.tenants());
    }
  }
  grpcutil::ClusterCredential cluster = grpcutil::ClusterCredential::Open();
  if (!config.cluster_token_file.empty()) {
    RECALL_ASSIGN_OR_RETURN(cluster, grpcutil::ClusterCredential::Load(config.cluster_token_file));
    s->cluster_token_ = cluster.token();
  }
  RECALL_RETURN_IF_ERROR(s->CheckKeysApartFromToken(s->keys_));
  s->registry_ =
      std::make_unique<WorkerRegistry>(&s->metrics_, absl::Milliseconds(500), 3, cluster);
  for (const std::string& w : config.workers) s->registry_->Add(w);
  metrics::Registry& m = s->metrics_;
  WorkerRegistry* reg = s->registry_.get();
  m.AddCallbackGauge("recall_coordinator_healthy_workers", "Workers answering heartbeats", [reg] {
    double n = 0;
    for (const WorkerView& w : reg->Snapshot()) n += w.healthy ? 1 : 0;
    return n;
  });
  s->conversations_ =
      std::make_unique<Conversations>(*s->store_, *s->registry_, config.options, s->metrics_);
  if (config.options.session_ttl_seconds > 0) {
    if (config.options.session_ttl_seconds < config.options.turn_lease_seconds) {
      RECALL_LOG(WARNING)
          << "--session-ttl " << config.options.session_ttl_seconds
          << " s is shorter than the turn lease (" << config.options.turn_lease_seconds
          << " s, recall-coordinator's --turn-lease): a turn whose coordinator died counts as "
             "idle from when it began, so its session may be deleted before a retry resumes "
             "it; give a ttl of at least the lease";
    }
    Conversations* conversations = s->conversations_.get();
    s->idle_sessions_ = std::make_unique<IdleSessions>(
        *s->store_, *s->registry_, absl::Seconds(config.options.session_ttl_seconds), s->metrics_,
        [conversations](const std::string& tenant, const std::string& id) {
          conversations->ForgetEpisodes(tenant + "/" + id);
        });
  }
  s->service_ = std::make_unique<ChatService>(*s->conversations_, *s->store_, *s->registry_,
                                              s->keys_, s->metrics_);
  s->registry_service_ = std::make_unique<RegistryService>(*s->registry_, s->keys_, cluster);
  std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
  if (!config.tls_cert.empty() || !config.tls_key.empty()) {
    auto read = [](const std::string& flag, const std::string& path) {
      return ReadSmallFile("--" + flag, path, kMaxPemBytes);
    };
    grpc::SslServerCredentialsOptions ssl(
        config.tls_client_ca.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                                     : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
    RECALL_ASSIGN_OR_RETURN(pair.private_key,
                            ReadSecretFile("--tls-key", config.tls_key, kMaxPemBytes));
    RECALL_ASSIGN_OR_RETURN(pair.cert_chain, read("tls-cert", config.tls_cert));
    RECALL_RETURN_IF_ERROR(
        tls::CheckCertificateDates("--tls-cert", config.tls_cert, pair.cert_chain));
    RECALL_RETURN_IF_ERROR(tls::CheckKeyMatchesCertificate(config.tls_key, pair.private_key,
                                                           config.tls_cert, pair.cert_chain));
    ssl.pem_key_cert_pairs.push_back(pair);
    if (!config.tls_client_ca.empty()) {
      RECALL_ASSIGN_OR_RETURN(ssl.pem_root_certs, read("tls-client-ca", config.tls_client_ca));
      RECALL_RETURN_IF_ERROR(
          tls::CheckHoldsCertificate("--tls-client-ca", config.tls_client_ca, ssl.pem_root_certs));
    }
    creds = grpc::SslServerCredentials(ssl);
  }
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  RECALL_RETURN_IF_ERROR(flags::SplitHostPort("listen", config.listen).status());
  builder.AddListeningPort(config.listen, creds, &s->port_);
  // A port another process holds is an error, not a second listener (gRPC's default
  // SO_REUSEPORT would let two coordinators share it).
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Chat: Converse and Generate on the callback API, the unary calls on the sync threads.
  builder.RegisterService(s->service_.get());
  builder.RegisterService(s->registry_service_.get());
  // Room above the message limit, so an oversized message is refused by the service naming
  // its field rather than by the transport.
  builder.SetMaxReceiveMessageSize(static_cast<int>(
      std::min<size_t>(4 * config.options.max_message_bytes + (1 << 20), 1 << 30)));
  builder.experimental().SetInterceptorCreators(grpcutil::StatusInterceptors(
      {v1::Chat::service_full_name(), v1::Registry::service_full_name()}));
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || s->port_ == 0) {
    return grpcutil::CannotListen(
        "--listen", config.listen,
        config.tls_cert.empty() ? " (is the port free?)"
                                : " (is the port free? are --tls-cert and --tls-key a matching "
                                  "PEM certificate and key?)");
  }
  grpcutil::MarkServing(*s->server_,
                        {v1::Chat::service_full_name(), v1::Registry::service_full_name()});
  if (config.metrics_port >= 0) {
    const std::string host = config.listen.substr(0, config.listen.find_last_of(':'));
    RECALL_ASSIGN_OR_RETURN(s->http_,
                            metrics::HttpServer::Start(host, config.metrics_port, &s->metrics_));
  }
  if (!config.http_listen.empty()) {
    HttpOptions http;
    http.listen = config.http_listen;
    http.threads = config.http_threads;
    http.completion_lease_ms = int64_t{config.completion_lease_seconds} * 1000;
    http.keepalive_ms = std::max<int64_t>(1, std::llround(config.sse_keepalive_seconds * 1000));
    http.tls_cert = config.tls_cert;
    http.tls_key = config.tls_key;
    http.tls_client_ca = config.tls_client_ca;
    http.max_body_bytes =
        std::max<size_t>(http.max_body_bytes, 4 * config.options.max_message_bytes);
    RECALL_ASSIGN_OR_RETURN(s->http_api_, HttpApi::Start(http, *s->conversations_, *s->registry_,
                                                         s->keys_, s->metrics_));
  }
  return s;
}

int CoordinatorServer::Drain(absl::Duration grace, const std::function<bool()>& interrupted) {
  conversations_->StopTakingTurns();
  if (server_ != nullptr) server_->GetHealthCheckService()->SetServingStatus(false);
  const absl::Time deadline = absl::Now() + grace;
  metrics::Gauge* running = TurnRunner::RunningTurns(metrics_);
  bool told = false;
  // None running for half a second: a turn's last words (its end stored, its last chunk
  // written to the client) come after its runner has ended, and a turn admitted just before
  // the stop starts its runner after its store writes.
  absl::Time none_since = absl::InfiniteFuture();
  while (absl::Now() < deadline) {
    const double n = running->value();
    if (n > 0) {
      none_since = absl::InfiniteFuture();
    } else if (none_since == absl::InfiniteFuture()) {
      none_since = absl::Now();
    } else if (absl::Now() - none_since >= absl::Milliseconds(500)) {
      break;
    }
    if (n > 0 && !told) {
      RECALL_LOG(WARNING) << "stopping: " << n << " turn(s) running get up to "
                          << absl::FormatDuration(grace)
                          << " to end; no new turn is taken (a second signal ends them now)";
      told = true;
    }
    if (interrupted()) break;  // about 100 ms
  }
  const int left = static_cast<int>(running->value());
  if (left > 0) Shutdown(std::chrono::milliseconds(0));
  return left;
}

void CoordinatorServer::Shutdown(std::chrono::milliseconds grace) {
  idle_sessions_.reset();
  if (http_api_ != nullptr) http_api_->Shutdown();
  if (server_ == nullptr) return;
  server_->GetHealthCheckService()->SetServingStatus(false);
  server_->Shutdown(std::chrono::system_clock::now() + grace);
  server_.reset();
}

absl::Status CoordinatorServer::CheckKeysApartFromToken(const ApiKeys& keys) const {
  // The two credentials are apart: a tenant holding the token could register and drain
  // workers, and the workers' holder could act as that tenant.
  if (!cluster_token_.empty() && keys.Has(cluster_token_)) {
    return absl::InvalidArgumentError(
        "--api-keys: one of its keys is the cluster token (--cluster-token-file); give "
        "tenants keys of their own");
  }
  return absl::OkStatus();
}

absl::Status CoordinatorServer::ReloadApiKeys() {
  if (api_keys_path_.empty()) {
    return absl::FailedPreconditionError(
        "no --api-keys: every caller is the tenant \"default\" (restart with --api-keys to "
        "turn keys on)");
  }
  absl::StatusOr<ApiKeys> loaded = ApiKeys::Load(api_keys_path_);
  absl::Status st = loaded.status();
  if (st.ok()) st = CheckKeysApartFromToken(*loaded);
  if (!st.ok()) {
    return absl::Status(st.code(), absl::StrCat(st.message(), " (the keys in use are kept)"));
  }
  keys_.Replace(*loaded);
  return absl::OkStatus();
}

CoordinatorServer::~CoordinatorServer() { Shutdown(); }

const flags::FlagSet<CoordinatorOptions>& LimitFlags() {
  static const flags::FlagSet<CoordinatorOptions>* const kFlags = [] {
    auto* f = new flags::FlagSet<CoordinatorOptions>();
    f->Section("coordinator")
        .Int(
            "max-message-bytes", "N", "user message / system prompt limit (default 262144)",
            [](auto& o) -> auto& { return o.max_message_bytes; }, 1, 64 << 20)
        .Int(
            "max-turns", "N", "exchanges per session (default 10000)",
            [](auto& o) -> auto& { return o.max_turns; }, 1, 1 << 30)
        .Int(
            "max-sessions", "N", "sessions per tenant (default 100000)",
            [](auto& o) -> auto& { return o.max_sessions_per_tenant; }, 1, 1 << 30)
        .Int(
            "max-running-per-tenant", "N",
            "turns one tenant may have running at once through this coordinator (session\n"
            "turns and Generate / completions); past it RESOURCE_EXHAUSTED (HTTP 429),\n"
            "retryable, while other tenants' turns go on (default 0: no limit; set it when\n"
            "tenants share workers, or one tenant's burst fills every worker's queue)",
            [](auto& o) -> auto& { return o.max_running_per_tenant; }, 0, 1 << 20)
        .Double(
            "session-ttl", "SECONDS",
            "delete a session idle this long (since its last turn began or ended),\n"
            "e.g. 2592000 for 30 days (default 0: keep every session until it is deleted)",
            [](auto& o) -> auto& { return o.session_ttl_seconds; }, 0, 1e10);
    return f;
  }();
  return *kFlags;
}

}  // namespace recall::coordinator
