// recall-worker: serves one model over gRPC (proto/recall/v1/worker.proto) to the
// coordinator, with continuous batching over per-session budgeted KV caches.
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cache/eviction/session_evictor.h"
#include "common/args.h"
#include "common/metrics/http_server.h"
#include "common/status.h"
#include "grpcpp/ext/health_check_service_server_builder_option.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "kernels/backend.h"
#include "recall/v1/registry.grpc.pb.h"
#include "worker/model/chat_stops.h"
#include "worker/model/load_from_flags.h"
#include "worker/service/engine_setup.h"
#include "worker/service/worker_service.h"
#include "worker/serving/scheduler.h"

namespace recall::service {
namespace {

constexpr char kUsage[] = R"(usage: recall-worker --model PATH [options]

Serves a model to the coordinator over gRPC (recall.v1.Worker), with the standard
grpc.health.v1 health service and Prometheus metrics over HTTP.

model:
  --model PATH            llama2.c checkpoint or Hugging Face folder
  --tokenizer PATH        tokenizer (required for llama2.c checkpoints)
  --random-weights        --model is a config.json (or its folder); random weights of that
                          shape in --dtype (f32, bf16, f16; default bf16), for benchmarks
  --chat-format NAME      chatml, llama2, llama3 or plain (default: guessed from the vocab)
serving:
  --listen HOST:PORT      gRPC address (default 127.0.0.1:50051; port 0 picks a free one)
  --metrics-port N        Prometheus /metrics on HOST:N (default: off; 0 picks a free one)
  --port-file PATH        write "grpc=PORT metrics=PORT" here once listening
  --coordinator HOST:PORT register with this coordinator (every 5 s, so a restarted
                          coordinator finds this worker again)
  --advertise HOST:PORT   the address the coordinator dials (default: --listen's host and
                          the bound port)
  --api-key KEY           for --coordinator when it checks keys
  --threads N             CPU threads for the model (default: all cores; split over the ranks)
devices and tensor parallelism:
  --device NAME           cpu (default) or cuda
  --tp N                  tensor parallelism: N ranks, each with its slice of the attention
                          heads, of the MLP and of every session's KV cache (default 1). CPU
                          ranks are threads; CUDA ranks are threads with a GPU each
  --devices LIST          CUDA device ordinals, one per rank, e.g. 0,1 (default 0..N-1); an
                          ordinal may repeat with --tp-comm staged
  --tp-comm KIND          how CUDA ranks all-reduce activations: nccl (default; distinct
                          GPUs) or staged (through host memory: slower, but ranks may share
                          a GPU, e.g. to check a tp > 1 deployment on one GPU)
  --tp-eviction MODE      how the ranks and heads agree on evictions, for sessions that do
                          not say: uniform (per-head counts; default), shared (one token set
                          per layer), head-adaptive (one global top-k over all KV heads)
  --no-cuda-graphs        cuda: launch every op of a decode step (default: one CUDA graph
                          per batch shape, replayed; one rank)
  --tp-verify             debug: every eviction step checks that all ranks kept the same
                          tokens; a mismatch fails the turn (INTERNAL) and drops the cache
memory:
  --kv-cache-bytes SIZE   KV pool size over all ranks, e.g. 512M or 2GiB (default:
                          --kv-cache-fraction)
  --kv-cache-fraction F   KV pool as a fraction of available host memory (cpu) or of the
                          device's free memory after the weights (cuda; with --tp, of each
                          GPU's, split between the ranks on it) (default 0.25)
  --host-cache-bytes SIZE host memory for offloaded idle sessions (default 4GiB)
scheduling:
  --max-batch-tokens N    tokens per forward step (default 256)
  --prefill-chunk N       prompt tokens per chunk (default 64)
  --max-active N          turns in the running batch (default 64)
  --max-queued N          turns waiting for memory before RESOURCE_EXHAUSTED (default 256)
  --max-tokens-limit N    upper bound of a turn's max_tokens (default: the context length)
  --no-batch-invariant    let batched matmuls use sgemm (faster prefill on some CPUs; a
                          session's greedy output may then depend on its batch)
session cache defaults (a turn's CacheSettings override them):
  --policy NAME           full (default), lazy, h2o, tova, streaming, snapkv, rkv, vase,
                          episodic (EpiCache, one CPU rank: --budget in tokens)
  --budget N              tokens per layer and KV head (default 1024)
  --budget-frac F         or a fraction of the sequence, in (0, 1]
  --window W              eviction window (default 32)
  --alpha A               LazyEviction threshold (default 1e-4)
  --layer-budgets SPEC    per-layer split of the budget: uniform (default), pyramid, a file
                          with one weight per layer, or `recall calibrate`'s JSON profile
  --layer-alpha A         the JSON profile's exponent, in [0.5, 3] (default 1.2)
  --episodes N            episodic: episodes per session at most, 1..16 (default 4)
  --embedder NAME         episodic: model (default) or tfidf
  --block-tokens N        episodic: tokens per block of the episodes' build (default 2048)
  --recluster-turns N     episodic: turns between rebuilds of a session's episodes (default 4)
)";

// Registers with a coordinator now and every 5 s until destroyed (recall.v1.Registry).
class Registration {
 public:
  Registration(const std::string& coordinator, const std::string& advertise, std::string key)
      : stub_(v1::Registry::NewStub(
            grpc::CreateChannel(coordinator, grpc::InsecureChannelCredentials()))),
        key_(std::move(key)),
        thread_([this, coordinator, advertise] {
          bool reported = false;
          absl::MutexLock lock(&mu_);
          while (!stop_) {
            grpc::ClientContext ctx;
            ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
            if (!key_.empty()) ctx.AddMetadata("authorization", "Bearer " + key_);
            v1::RegisterRequest req;
            req.set_address(advertise);
            v1::RegisterResponse resp;
            mu_.Unlock();
            const grpc::Status st = stub_->Register(&ctx, req, &resp);
            mu_.Lock();
            if (st.ok() != reported) {
              std::fprintf(stderr, "recall-worker: %s with coordinator %s as %s%s%s\n",
                           st.ok() ? "registered" : "cannot register", coordinator.c_str(),
                           advertise.c_str(), st.ok() ? "" : ": ",
                           st.ok() ? "" : st.error_message().c_str());
              reported = st.ok();
            }
            auto stopping = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stop_; };
            mu_.AwaitWithTimeout(absl::Condition(&stopping), absl::Seconds(5));
          }
        }) {}
  ~Registration() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }

 private:
  std::unique_ptr<v1::Registry::Stub> stub_;
  const std::string key_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

absl::Status Run(const std::vector<std::string>& argv) {
  RECALL_ASSIGN_OR_RETURN(
      const Args args,
      Args::Parse(argv,
                  {"model", "tokenizer", "dtype", "chat-format", "listen", "metrics-port",
                   "port-file", "threads", "kv-cache-bytes", "kv-cache-fraction",
                   "host-cache-bytes", "max-batch-tokens", "prefill-chunk", "max-active",
                   "max-queued", "max-tokens-limit", "policy", "budget", "budget-frac", "window",
                   "alpha", "coordinator", "advertise", "api-key", "device", "tp", "devices",
                   "tp-comm",
                   "tp-eviction", "episodes", "embedder", "block-tokens", "recluster-turns",
                   "layer-budgets", "layer-alpha"},
                  {"random-weights", "no-batch-invariant", "no-cuda-graphs", "tp-verify",
                   "help"}));
  if (args.Has("help")) {
    std::cout << kUsage;
    return absl::OkStatus();
  }
  RECALL_ASSIGN_OR_RETURN(model::Loaded loaded, model::LoadAll(args));
  const model::ModelConfig& config = loaded.model->config;
  const model::Tokenizer& tok = *loaded.tokenizer;

  serving::SchedulerOptions o;
  RECALL_ASSIGN_OR_RETURN(const int64_t threads, args.GetInt("threads", 0, 0, 1024));
  RECALL_ASSIGN_OR_RETURN(const int64_t mbt, args.GetInt("max-batch-tokens", 256, 1, 1 << 16));
  RECALL_ASSIGN_OR_RETURN(const int64_t chunk, args.GetInt("prefill-chunk", 64, 1, mbt));
  RECALL_ASSIGN_OR_RETURN(const int64_t active, args.GetInt("max-active", 64, 1, 4096));
  RECALL_ASSIGN_OR_RETURN(const int64_t queued, args.GetInt("max-queued", 256, 0, 1 << 20));
  RECALL_ASSIGN_OR_RETURN(const int64_t limit, args.GetInt("max-tokens-limit", config.max_seq_len,
                                                           1, config.max_seq_len));
  RECALL_ASSIGN_OR_RETURN(o.host_cache_bytes,
                          args.GetBytes("host-cache-bytes", int64_t{4} << 30, 0));
  o.max_batch_tokens = static_cast<int>(mbt);
  o.prefill_chunk = static_cast<int>(chunk);
  o.max_active = static_cast<int>(active);
  o.max_queued = static_cast<int>(queued);
  o.limits.max_tokens = static_cast<int>(limit);
  o.batch_invariant = !args.Has("no-batch-invariant");
  o.step_graphs = !args.Has("no-cuda-graphs");
  o.chat_format = model::GuessChatFormat(tok);
  if (args.Has("chat-format")) {
    RECALL_ASSIGN_OR_RETURN(o.chat_format, model::ParseChatFormat(args.GetString("chat-format")));
  }
  const model::ReplyStops stops =
      model::StopsFor(o.chat_format, tok, /*bos_ends_sequence=*/!loaded.hf_tokenizer, true);
  o.stop_token_ids = stops.token_ids;
  o.stop_strings = stops.strings;
  o.default_policy = args.GetString("policy", "full");
  if (args.Has("budget") && args.Has("budget-frac")) {
    return absl::InvalidArgumentError("--budget and --budget-frac are exclusive; give one");
  }
  RECALL_ASSIGN_OR_RETURN(const int64_t budget, args.GetInt("budget", 1024, 1, 1 << 24));
  o.default_budget_tokens = static_cast<int>(budget);
  if (args.Has("budget-frac")) {
    RECALL_ASSIGN_OR_RETURN(o.default_budget_fraction, args.GetDouble("budget-frac", 1, 1e-6, 1));
  }
  RECALL_ASSIGN_OR_RETURN(const int64_t window, args.GetInt("window", 32, 1, 1 << 20));
  o.default_window = static_cast<int>(window);
  RECALL_ASSIGN_OR_RETURN(o.default_alpha, args.GetDouble("alpha", 1e-4, 1e-12, 0.999999));
  o.default_tp_eviction = args.GetString("tp-eviction", "uniform");
  {
    cache::eviction::SessionEvictorOptions probe;
    const absl::Status mode = cache::eviction::ApplyTpEvictionMode(o.default_tp_eviction, probe);
    if (!mode.ok()) return absl::InvalidArgumentError(absl::StrCat("--tp-eviction: ", mode.message()));
  }
  o.verify_tp_keep = args.Has("tp-verify");
  RECALL_ASSIGN_OR_RETURN(const int64_t episodes,
                          args.GetInt("episodes", 4, 1, serving::kMaxEpisodes));
  RECALL_ASSIGN_OR_RETURN(const int64_t block_tokens, args.GetInt("block-tokens", 2048, 16, 1 << 16));
  RECALL_ASSIGN_OR_RETURN(const int64_t recluster, args.GetInt("recluster-turns", 4, 1, 1 << 20));
  o.default_episodes = static_cast<int>(episodes);
  o.default_block_tokens = static_cast<int>(block_tokens);
  o.default_recluster_turns = static_cast<int>(recluster);
  o.default_embedder = args.GetString("embedder", "model");
  if (o.default_embedder != "model" && o.default_embedder != "tfidf") {
    return absl::InvalidArgumentError(absl::StrCat("--embedder: unknown embedder \"",
                                                   o.default_embedder, "\" (one of model, tfidf)"));
  }
  o.layer_budgets = args.GetString("layer-budgets", "uniform");
  RECALL_ASSIGN_OR_RETURN(o.layer_alpha, args.GetDouble("layer-alpha", 1.2, 0.5, 3));
  {
    cache::eviction::BudgetOptions probe;
    cache::eviction::ApplyLayerBudgets(o.layer_budgets, o.layer_alpha, &probe);
    const absl::Status st = cache::eviction::BudgetAllocator::Create(probe, config.n_layers).status();
    if (!st.ok()) return absl::InvalidArgumentError(absl::StrCat("--layer-budgets: ", st.message()));
  }
  if (o.default_policy == "episodic" &&
      (args.GetString("tp", "1") != "1" || args.GetString("device", "cpu") != "cpu")) {
    return absl::InvalidArgumentError(
        "--policy episodic: runs on one CPU rank (its block-wise build scores keys on the host); "
        "drop --tp and --device");
  }
  if (o.default_policy == "episodic" && args.Has("budget-frac")) {
    return absl::InvalidArgumentError("--budget-frac: episodic needs --budget in tokens");
  }

  EngineFlags flags;
  RECALL_ASSIGN_OR_RETURN(const int64_t tp, args.GetInt("tp", 1, 1, 64));
  flags.tp = static_cast<int>(tp);
  flags.device = args.GetString("device", "cpu");
  flags.tp_comm = args.GetString("tp-comm", "");
  if (args.Has("devices")) {
    RECALL_ASSIGN_OR_RETURN(flags.devices, runtime::tp::ParseDevices(args.GetString("devices")));
  }
  flags.threads = static_cast<int>(threads);
  RECALL_ASSIGN_OR_RETURN(flags.kv_fraction,
                          args.GetDouble("kv-cache-fraction", 0.25, 1e-6, 0.95));
  if (args.Has("kv-cache-bytes")) {
    RECALL_ASSIGN_OR_RETURN(flags.kv_bytes, args.GetBytes("kv-cache-bytes", 0, 1));
  }
  metrics::Registry registry;
  RECALL_ASSIGN_OR_RETURN(Engine engine, BuildEngine(*loaded.model, tok, flags, o, &registry));
  serving::Scheduler* scheduler = engine.scheduler.get();

  std::string model_name = args.GetString("model");
  while (model_name.size() > 1 && model_name.back() == '/') model_name.pop_back();
  model_name = model_name.substr(model_name.find_last_of('/') + 1);
  WorkerService service(*scheduler, {model_name, flags.tp, "0.1.0"});

  // Signals: handled by sigwait below, so block them before gRPC starts its threads.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  const std::string listen = args.GetString("listen", "127.0.0.1:50051");
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  builder.SetMaxReceiveMessageSize(64 << 20);  // full transcripts
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("--listen: cannot listen on ", listen));
  }
  server->GetHealthCheckService()->SetServingStatus(true);

  std::unique_ptr<metrics::HttpServer> http;
  if (args.Has("metrics-port")) {
    RECALL_ASSIGN_OR_RETURN(const int64_t mport, args.GetInt("metrics-port", 0, 0, 65535));
    const std::string host = listen.substr(0, listen.find_last_of(':'));
    RECALL_ASSIGN_OR_RETURN(http, metrics::HttpServer::Start(host, static_cast<int>(mport),
                                                             &registry));
  }
  std::fprintf(stderr, "recall-worker: serving %s (%s chat) on %s, port %d; %s; metrics %s\n",
               model_name.c_str(), model::ChatFormatName(o.chat_format), listen.c_str(), port,
               engine.summary.c_str(),
               http ? absl::StrCat("on port ", http->port()).c_str() : "off");
  if (args.Has("port-file")) {
    const std::string path = args.GetString("port-file");
    const std::string tmp = path + ".tmp";
    {
      std::ofstream out(tmp);
      out << "grpc=" << port << " metrics=" << (http ? http->port() : 0) << "\n";
    }
    std::rename(tmp.c_str(), path.c_str());  // readers never see a partial file
  }

  std::unique_ptr<Registration> registration;
  if (args.Has("coordinator")) {
    const std::string advertise =
        args.GetString("advertise", absl::StrCat(listen.substr(0, listen.find_last_of(':')), ":",
                                                 port));
    registration = std::make_unique<Registration>(args.GetString("coordinator"), advertise,
                                                  args.GetString("api-key"));
  }

  int sig = 0;
  sigwait(&signals, &sig);
  registration.reset();
  std::fprintf(stderr, "recall-worker: signal %d, shutting down\n", sig);
  server->GetHealthCheckService()->SetServingStatus(false);
  scheduler->AbortAll();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
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
