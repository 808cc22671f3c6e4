// recall-worker: serves one model over gRPC (proto/recall/v1/worker.proto) to the
// coordinator, with continuous batching over per-session budgeted KV caches.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cache/eviction/session_evictor.h"
#include "common/files.h"
#include "common/flags.h"
#include "common/grpc/quiet_handshakes.h"
#include "common/grpc/server_start.h"
#include "common/grpc/status_interceptor.h"
#include "common/metrics/http_server.h"
#include "common/status.h"
#include "common/stop_signals.h"
#include "grpcpp/ext/health_check_service_server_builder_option.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "kernels/backend.h"
#include "recall/v1/registry.grpc.pb.h"
#include "worker/model/chat_stops.h"
#include "worker/model/load.h"
#include "worker/runtime/engine.h"
#include "worker/service/worker_options.h"
#include "worker/service/worker_service.h"
#include "worker/serving/scheduler.h"

namespace recall::service {
namespace {

constexpr char kUsageHead[] = R"(usage: recall-worker --model PATH [options]

Serves a model to the coordinator over gRPC (recall.v1.Worker), with the standard
grpc.health.v1 health service and Prometheus metrics over HTTP. A turn's CacheSettings
override the session cache defaults below.

)";

// Registers with a coordinator now and every 5 s until destroyed (recall.v1.Registry).
class Registration {
 public:
  Registration(const std::string& coordinator, const std::string& advertise,
               const std::string& instance, grpcutil::ClusterCredential cluster)
      : stub_(v1::Registry::NewStub(grpc::CreateCustomChannel(
            coordinator, grpc::InsecureChannelCredentials(), ReconnectWithin5s()))),
        cluster_(std::move(cluster)),
        coordinator_(coordinator),
        advertise_(advertise),
        thread_([this, coordinator, advertise, instance] {
          std::optional<std::string> reported;  // the last outcome's key told (none yet)
          absl::MutexLock lock(&mu_);
          while (!stop_) {
            grpc::ClientContext ctx;
            Prepare(ctx);
            v1::RegisterRequest req;
            req.set_address(advertise);
            req.set_instance(instance);
            v1::RegisterResponse resp;
            mu_.Unlock();
            const grpc::Status st = stub_->Register(&ctx, req, &resp);
            mu_.Lock();
            // Registered, registered but not used (its model conflicts), or refused.
            const std::string outcome = absl::StrCat(
                st.ok() ? "registered" : "cannot register", " with coordinator ", coordinator,
                " as ", advertise,
                st.ok() ? (resp.not_used().empty()
                               ? ""
                               : absl::StrCat(", which sends it no turn: ", resp.not_used()))
                        : absl::StrCat(": ", st.error_message(),
                                       // A TLS coordinator closes a plaintext connection.
                                       st.error_code() == grpc::StatusCode::UNAVAILABLE
                                           ? " (is it up and reachable? a worker registers "
                                             "over plaintext: a coordinator serving TLS closes "
                                             "its connection)"
                                           : ""));
            // Said when it changes: by its code and the reason it is not used, not by gRPC's
            // words for a refused connection, which vary from one try to the next.
            const std::string key = absl::StrCat(st.error_code(), "/", resp.not_used());
            if (reported != key) {
              std::fprintf(stderr, "recall-worker: %s\n", outcome.c_str());
              reported = key;
            }
            auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
            mu_.AwaitWithTimeout(absl::Condition(&stopping), absl::Seconds(5));
          }
        }) {}
  ~Registration() { Stop(); }

  // Stops registering (a registration would end the drain), then asks the coordinator to
  // route nothing new here (Registry.Drain); a failure is logged.
  void Drain() {
    Stop();
    grpc::ClientContext ctx;
    Prepare(ctx);
    v1::DrainRequest req;
    req.set_address(advertise_);
    v1::DrainResponse resp;
    const grpc::Status st = stub_->Drain(&ctx, req, &resp);
    if (!st.ok()) {
      std::fprintf(stderr, "recall-worker: cannot tell coordinator %s to drain %s: %s\n",
                   coordinator_.c_str(), advertise_.c_str(), st.error_message().c_str());
    }
  }

 private:
  // gRPC's reconnect backoff grows to 2 minutes: after a coordinator outage of minutes the
  // worker registered again up to a minute after the coordinator was back. Every 5 s at most.
  static grpc::ChannelArguments ReconnectWithin5s() {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 1000);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 1000);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 5000);
    return args;
  }

  // A call to the coordinator: 2 s, with the cluster token.
  void Prepare(grpc::ClientContext& ctx) const {
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    cluster_.Attach(&ctx);
  }

  void Stop() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    if (thread_.joinable()) thread_.join();
  }

  std::unique_ptr<v1::Registry::Stub> stub_;
  const grpcutil::ClusterCredential cluster_;
  const std::string coordinator_, advertise_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

absl::Status Run(const std::vector<std::string>& argv) {
  for (const std::string& a : argv) {
    if (a == "--help" || a == "-h") {
      std::cout << kUsageHead << WorkerFlags().Help();
      return absl::OkStatus();
    }
  }
  WorkerOptions options;
  RECALL_RETURN_IF_ERROR(WorkerFlags().Parse(argv, &options));

  // Before the model loads (which may take minutes).
  // (A --coordinator or --advertise port past 65535 was dialed wrapped around: 99999 as 34463.)
  const auto address = [](const char* field, const std::string& value, bool optional) {
    return optional && value.empty() ? absl::OkStatus()
                                     : flags::SplitHostPort(field, value).status();
  };
  for (const absl::Status& st :
       {address("listen", options.listen, false), address("coordinator", options.coordinator, true),
        address("advertise", options.advertise, true)}) {
    if (!st.ok()) return WorkerFlags().Explain(st);
  }
  RECALL_RETURN_IF_ERROR(ResolveWorkerOptions(&options));
  absl::StatusOr<model::Loaded> loaded = model::LoadAll(options.model);
  if (!loaded.ok()) return WorkerFlags().Explain(loaded.status());
  const model::Tokenizer& tok = *loaded->tokenizer;
  RECALL_RETURN_IF_ERROR(ApplyModel(loaded->model->config, tok, loaded->hf_tokenizer, &options));

  metrics::Registry registry;
  absl::StatusOr<std::unique_ptr<runtime::Engine>> engine =
      runtime::Engine::Create(*loaded->model, options.engine);
  if (!engine.ok()) return WorkerFlags().Explain(engine.status());
  absl::StatusOr<std::unique_ptr<serving::Scheduler>> created =
      serving::Scheduler::Create(**engine, tok, options.scheduler, &registry);
  if (!created.ok()) return WorkerFlags().Explain(created.status());
  serving::Scheduler* scheduler = created->get();

  std::string model_name = options.model.model;
  while (model_name.size() > 1 && model_name.back() == '/') model_name.pop_back();
  // Random weights given as a config.json are named by its folder (SmolLM2-135M), not the file.
  if (options.model.random_weights && absl::EndsWith(model_name, "/config.json")) {
    model_name.resize(model_name.size() - std::string("/config.json").size());
  }
  model_name = model_name.substr(model_name.find_last_of('/') + 1);
  if (!options.served_model_name.empty()) model_name = options.served_model_name;
  grpcutil::ClusterCredential cluster = grpcutil::ClusterCredential::Open();
  if (!options.cluster_token_file.empty()) {
    RECALL_ASSIGN_OR_RETURN(cluster, grpcutil::ClusterCredential::Load(options.cluster_token_file));
  }
  // This process's id, in Info and in its registrations.
  std::random_device rd;
  const std::string instance =
      absl::StrCat(absl::Hex(rd(), absl::kZeroPad8), absl::Hex(rd(), absl::kZeroPad8));
  WorkerService service(*scheduler, {model_name, options.engine.tp, "0.1.0", instance}, cluster);
  // Signals: waited for below (until here, while the model loads, one ends the worker).
  StopSignals stop;
  grpcutil::QuietHandshakeLogs();

  const std::string& listen = options.listen;
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port);
  // A port another process holds is an error, not a second listener (gRPC's default
  // SO_REUSEPORT would let two workers share it).
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.RegisterService(&service);
  builder.SetMaxReceiveMessageSize(64 << 20);  // full transcripts
  builder.experimental().SetInterceptorCreators(
      grpcutil::StatusInterceptors({v1::Worker::service_full_name()}));
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return grpcutil::CannotListen("--listen", listen, " (is the port free?)");
  }
  grpcutil::MarkServing(*server, {v1::Worker::service_full_name()});

  std::unique_ptr<metrics::HttpServer> http;
  if (options.metrics_port.has_value()) {
    const std::string host = listen.substr(0, listen.find_last_of(':'));
    RECALL_ASSIGN_OR_RETURN(http,
                            metrics::HttpServer::Start(host, *options.metrics_port, &registry));
  }
  std::fprintf(stderr, "recall-worker: serving %s (%s chat) on %s, port %d; %s; metrics %s\n",
               model_name.c_str(), model::ChatFormatName(options.scheduler.chat_format),
               listen.c_str(), port, (*engine)->Summary().c_str(),
               http ? absl::StrCat("on port ", http->port()).c_str() : "off");
  {
    // The session defaults a CacheRequest leaves unset (flags over --calibration's file; the
    // built-in budget lowered to fit the model's context).
    const serving::CacheDefaults& d = scheduler->options().cache;
    const std::string budget = d.budget_fraction.has_value()
                                   ? absl::StrCat(*d.budget_fraction * 100, "%")
                                   : absl::StrCat(d.budget_tokens, " tokens");
    std::string extra;
    if (d.alpha_uniform > 0) absl::StrAppend(&extra, ", alpha-uniform ", d.alpha_uniform);
    if (d.value_protection > 0) absl::StrAppend(&extra, ", value protection ", d.value_protection);
    if (d.meta_score != "none") absl::StrAppend(&extra, ", meta score ", d.meta_score);
    if (d.policy == "lazy+") {
      absl::StrAppend(&extra, ", attention weight ", d.attention_weight, " decay ",
                      d.attention_decay);
    }
    std::fprintf(stderr,
                 "recall-worker: session defaults: policy %s, budget %s, window %d, alpha %g%s%s\n",
                 d.policy.c_str(), budget.c_str(), d.window, d.alpha, extra.c_str(),
                 options.calibration_file.empty()
                     ? ""
                     : absl::StrCat(" (calibration ", options.calibration_file, ")").c_str());
  }
  if (!cluster.enabled()) {
    std::fprintf(stderr,
                 "recall-worker: WARNING: no --cluster-token-file; this port takes RunTurn, "
                 "DropSession and Abort from anyone who can reach it (%s, port %d)\n",
                 listen.c_str(), port);
  }
  if (!options.port_file.empty()) {
    RECALL_RETURN_IF_ERROR(
        WritePortFile(options.port_file,
                      absl::StrCat("grpc=", port, " metrics=", (http ? http->port() : 0), "\n")));
  }

  std::unique_ptr<Registration> registration;
  if (!options.coordinator.empty()) {
    const std::string advertise =
        !options.advertise.empty()
            ? options.advertise
            : absl::StrCat(listen.substr(0, listen.find_last_of(':')), ":", port);
    registration =
        std::make_unique<Registration>(options.coordinator, advertise, instance, cluster);
  }

  const int sig = stop.Wait();
  const absl::Time deadline = absl::Now() + absl::Seconds(options.shutdown_grace_seconds);
  std::fprintf(stderr, "recall-worker: signal %d, shutting down\n", sig);
  // Running and waiting turns end first (up to --shutdown-grace from the signal, or a second
  // signal); new ones are refused, and coordinators send none (LoadReport.stopping; a
  // registered worker also asks its coordinator to drain it).
  scheduler->StopTakingTurns();
  server->GetHealthCheckService()->SetServingStatus(false);
  if (registration != nullptr) registration->Drain();
  bool told = false;
  for (;;) {
    const int running = scheduler->TurnsNotDone();
    if (running == 0 || absl::Now() >= deadline) break;
    if (!told) {
      std::fprintf(stderr,
                   "recall-worker: %d turn(s) running get up to %g s to end; no new turn is "
                   "taken (a second signal ends them now)\n",
                   running, options.shutdown_grace_seconds);
      told = true;
    }
    if (stop.Wait(absl::Milliseconds(100)) != 0) break;  // a second signal
  }
  stop.Ignore();
  registration.reset();
  scheduler->AbortAll();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  return absl::OkStatus();
}

}  // namespace
}  // namespace recall::service

int main(int argc, char** argv) {
  const absl::Status st = recall::service::Run(std::vector<std::string>(argv + 1, argv + argc));
  if (!st.ok()) {
    std::fprintf(stderr, "recall-worker: %s\n", std::string(st.message()).c_str());
    return st.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}
