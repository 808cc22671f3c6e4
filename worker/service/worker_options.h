// The options of a worker, and the flag tables that fill them: the one place where a
// worker's flags are spelled. recall-worker parses its command line with WorkerFlags();
// `recall serve` parses the same flags into the same struct and hands them to its
// recall-worker child with WorkerFlags().Render, so every worker flag reaches the worker.
// The pieces (ModelFlags, EngineFlags, SessionCacheFlags, ...) are shared with `recall
// generate`, `recall chat` and `recall calibrate`, so a flag means the same everywhere.
#pragma once

#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "common/flags.h"
#include "worker/model/load.h"
#include "worker/model/model_config.h"
#include "worker/runtime/engine.h"
#include "worker/serving/cache_factory.h"
#include "worker/serving/scheduler.h"
#include "worker/tokenizer/tokenizer.h"

namespace recall::service {

struct WorkerOptions {
  model::LoadOptions model;
  std::optional<std::string> chat_format;  // default: guessed from the vocabulary
  // Serving.
  std::string listen = "127.0.0.1:50051";
  std::optional<int> metrics_port;  // Prometheus /metrics on the listen host (0: a free port)
  std::string port_file;            // "grpc=PORT metrics=PORT" once listening
  std::string coordinator;          // register with it (every 5 s)
  std::string advertise;            // the address the coordinator dials
  std::string cluster_token_file;   // the cluster credential (this port, and registering)
  // On SIGTERM or SIGINT: running turns get this long to end while no new one is taken
  // (and the coordinator is told to drain this worker); a second signal ends them at once.
  double shutdown_grace_seconds = 25;
  // The model's name in Info, the coordinator's /v1/models and requests' "model" (default:
  // the model path's last component). Checked by ResolveWorkerOptions.
  std::string served_model_name;
  runtime::EngineOptions engine;
  serving::SchedulerOptions scheduler;
  std::optional<int> max_tokens_limit;  // a turn's max_tokens at most (default: the context)
  // `recall calibrate-window --out` file: its window and alpha become the session defaults
  // (ResolveWorkerOptions; --window and --alpha still win).
  std::string calibration_file;
  // Session cache defaults as the flags give them (over scheduler.cache's).
  serving::CacheRequest cache;
};

// The model to load: --model, --tokenizer, --random-weights, --dtype.
flags::FlagSet<model::LoadOptions> ModelFlags();
// Devices, tensor parallelism, threads, the KV pool, batch invariance, CUDA graphs.
flags::FlagSet<runtime::EngineOptions> EngineFlags();
// A session's cache settings (--policy, --budget | --budget-frac, --window, --alpha,
// --tp-eviction, and the episodic ones): a worker's defaults, `recall chat`'s session,
// `recall generate`'s sequence. Their help gives `defaults`' values as the defaults (none
// when null: `recall chat`'s are the server's).
flags::FlagSet<serving::CacheRequest> SessionCacheFlags(
    const serving::CacheDefaults* defaults = nullptr);
// What every session of a worker (or `recall generate`'s sequence) shares: --layer-budgets,
// --layer-alpha, --tp-verify.
flags::FlagSet<serving::CacheDefaults> SharedCacheFlags();
// Batching and queues: --max-batch-tokens, --prefill-chunk, --max-active, --max-queued,
// --host-cache-bytes.
flags::FlagSet<serving::SchedulerOptions> SchedulingFlags();
// Every flag of recall-worker.
const flags::FlagSet<WorkerOptions>& WorkerFlags();

// OK for "" (the default name) and a name of at most 256 bytes without spaces, control
// characters, quotes or backslashes; InvalidArgument naming --served-model-name otherwise.
absl::Status CheckServedModelName(const std::string& name);

// After parsing: the options that follow from others (the forward passes take the batch;
// the session cache defaults with the flags' settings applied; episodic needs one CPU rank).
// InvalidArgument naming the flag.
absl::Status ResolveWorkerOptions(WorkerOptions* options);

// The budget flags given (`given`: the session cache flags as parsed) that a cache of policy
// full ignores, named for a warning ("--budget, --window"); "" when none or when `resolved`
// evicts. ResolveWorkerOptions logs it; recall generate prints it.
std::string IgnoredBudgetFlags(const serving::CacheRequest& given,
                               const serving::CacheDefaults& resolved);

// After loading: the chat format (given, or guessed), its stop tokens and strings, and the
// max_tokens limit, into options->scheduler.
absl::Status ApplyModel(const model::ModelConfig& config, const model::Tokenizer& tokenizer,
                        bool hf_tokenizer, WorkerOptions* options);

}  // namespace recall::service
