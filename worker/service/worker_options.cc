#include "worker/service/worker_options.h"

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/status.h"
#include "worker/model/chat_stops.h"
#include "worker/model/chat_template.h"
#include "worker/serving/calibration.h"

namespace recall::service {

flags::FlagSet<model::LoadOptions> ModelFlags() {
  flags::FlagSet<model::LoadOptions> f;
  f.Section("model")
      .String(
          "model", "PATH", "llama2.c checkpoint or Hugging Face folder",
          [](auto& o) -> auto& { return o.model; })
      .String(
          "tokenizer", "PATH",
          "tokenizer.bin (llama2.c), tokenizer.model or tokenizer.json (default: the one\n"
          "in the model's folder; required for a llama2.c checkpoint)",
          [](auto& o) -> auto& { return o.tokenizer; })
      .Switch(
          "random-weights",
          "--model is a config.json (or its folder); random weights of that shape in\n"
          "--dtype, for benchmarks",
          [](auto& o) -> auto& { return o.random_weights; })
      .Choice("dtype", "TYPE", "--random-weights' type: f32, bf16 (default) or f16",
              [](auto& o) -> auto& { return o.random_dtype; }, {"f32", "bf16", "f16"})
      .Field("random_dtype")
      .Choice("weight-dtype", "TYPE",
              "how matrix weights are held: auto (as loaded, an FP8 checkpoint widened to\n"
              "bf16; default), int8 (quantized at load, one scale per output channel: about\n"
              "half the bytes of bf16 to read per token) or fp8 (E4M3 with block scales: an FP8\n"
              "checkpoint's linear weights as stored, any other model's quantized at load;\n"
              "CUDA devices only)",
              [](auto& o) -> auto& { return o.weight_dtype; }, {"auto", "int8", "fp8"})
      .Field("weight_dtype");
  return f;
}

flags::FlagSet<runtime::EngineOptions> EngineFlags() {
  flags::FlagSet<runtime::EngineOptions> f;
  f.Section("devices and tensor parallelism")
      .Enum(
          "device", "NAME", "cpu (default) or cuda", [](auto& o) -> auto& { return o.device; },
          std::vector<std::pair<std::string, runtime::Device>>{{"cpu", runtime::Device::kCpu},
                                                               {"cuda", runtime::Device::kCuda}})
      .Int(
          "tp", "N",
          "tensor parallelism: N ranks, each with its slice of the attention heads, of the\n"
          "MLP and of every session's KV cache (default 1). CPU ranks are threads; CUDA ranks\n"
          "are threads with a GPU each",
          [](auto& o) -> auto& { return o.tp; }, 1, 64)
      .Value(
          "devices", "LIST",
          "CUDA device ordinals, one per rank, e.g. 0,1 (default 0..N-1); an ordinal may\n"
          "repeat with --tp-comm staged",
          [](auto& o) -> auto& { return o.devices; }, 0, 1024)
      .Enum(
          "tp-comm", "KIND",
          "how CUDA ranks all-reduce activations: nccl (default; distinct GPUs) or staged\n"
          "(through host memory: slower, but ranks may share a GPU)",
          [](auto& o) -> auto& { return o.tp_comm; },
          std::vector<std::pair<std::string, runtime::TpComm>>{
              {"nccl", runtime::TpComm::kNccl}, {"staged", runtime::TpComm::kStaged}})
      .Int(
          "threads", "N", "CPU threads for the model (default: all cores; split over the ranks)",
          [](auto& o) -> auto& { return o.threads; }, 0, 1024)
      .Switch(
          "no-batch-invariant",
          "let batched matmuls use sgemm (faster prefill on some CPUs; a session's greedy\n"
          "output may then depend on its batch)",
          [](auto& o) -> auto& { return o.forward.batch_invariant; }, false)
      .Switch(
          "no-cuda-graphs",
          "cuda: launch every op of a decode step (default: one CUDA graph per batch\n"
          "shape, replayed; one rank)",
          [](auto& o) -> auto& { return o.forward.step_graphs; }, false)
      .Section("memory")
      .Bytes(
          "kv-cache-bytes", "SIZE",
          "KV pool size over all ranks, e.g. 512M or 2GiB (default: --kv-cache-fraction);\n"
          "it holds the sessions' KV blocks, their eviction policies' state and the running\n"
          "turns' attention scratch",
          [](auto& o) -> auto& { return o.kv_cache_bytes; }, 1)
      .Enum(
          "kv-dtype", "TYPE",
          "how the KV cache stores keys and values: bf16 (default; half of f32's bytes,\n"
          "greedy text close to f32's), f16, int8 (a quarter, one fp32 scale per row) or\n"
          "f32. Attention widens every row to fp32",
          [](auto& o) -> auto& { return o.kv_dtype; },
          std::vector<std::pair<std::string, kernels::KvDType>>{{"f32", kernels::KvDType::kF32},
                                                                {"bf16", kernels::KvDType::kBF16},
                                                                {"f16", kernels::KvDType::kF16},
                                                                {"int8", kernels::KvDType::kInt8}})
      .Double(
          "kv-cache-fraction", "F",
          "KV pool as a fraction of available host memory (cpu) or of the device's free\n"
          "memory after the weights (cuda; with --tp, of each GPU's, split between the\n"
          "ranks on it) (default 0.25)",
          [](auto& o) -> auto& { return o.kv_cache_fraction; }, flags::kAboveZero, 0.95);
  return f;
}

flags::FlagSet<serving::CacheRequest> SessionCacheFlags(const serving::CacheDefaults* defaults) {
  // " (default V)", after a line end where the line would be too long.
  const auto shown = [defaults](auto value, const char* before = " ") {
    return defaults == nullptr ? std::string() : absl::StrCat(before, "(default ", value, ")");
  };
  const serving::CacheDefaults d = defaults != nullptr ? *defaults : serving::CacheDefaults();
  flags::FlagSet<serving::CacheRequest> f;
  f.Section("session cache")
      .String(
          "policy", "NAME",
          "full, lazy, lazy+, h2o, tova, streaming, snapkv, rkv, vase, or episodic\n"
          "(EpiCache, one CPU rank: --budget in tokens)" +
              shown(d.policy),
          [](auto& o) -> auto& { return o.policy; })
      .Int(
          "budget", "N", "KV budget in tokens per layer and KV head" + shown(d.budget_tokens),
          [](auto& o) -> auto& { return o.budget_tokens; }, 1, 1 << 24)
      .Field("budget_tokens")
      .Double(
          "budget-frac", "F", "or a fraction of the sequence, in (0, 1]",
          [](auto& o) -> auto& { return o.budget_fraction; }, flags::kAboveZero, 1)
      .Field("budget_fraction")
      .Exclusive("budget", "budget-frac")
      .Int(
          "window", "W",
          "eviction window: lazy evicts every W steps and keeps the last W" + shown(d.window, "\n"),
          [](auto& o) -> auto& { return o.window; }, 1, 1 << 20)
      .Double(
          "alpha", "A", "LazyEviction's importance threshold" + shown(flags::FormatDouble(d.alpha)),
          [](auto& o) -> auto& { return o.alpha; }, 1e-12, 0.999999)
      .Choice("tp-eviction", "MODE",
              "how ranks and heads agree on evictions: uniform (per-head counts), shared (one\n"
              "token set per layer), head-adaptive (one global top-k over all KV heads)" +
                  shown(d.tp_eviction, "\n"),
              [](auto& o) -> auto& { return o.tp_eviction; },
              {"uniform", "shared", "head-adaptive"})
      .Int(
          "episodes", "N", "episodic: episodes per session at most" + shown(d.episodes),
          [](auto& o) -> auto& { return o.episodes; }, 1, serving::kMaxEpisodes)
      .Choice("embedder", "NAME",
              "episodic: model (mean-pooled hidden states) or tfidf" + shown(d.embedder),
              [](auto& o) -> auto& { return o.embedder; }, {"model", "tfidf"})
      .Int(
          "block-tokens", "N",
          "episodic: tokens per block of the episodes' build" + shown(d.block_tokens),
          [](auto& o) -> auto& { return o.block_tokens; }, 16, 1 << 16)
      .Int(
          "recluster-turns", "N",
          "episodic: turns between rebuilds of a session's episodes" + shown(d.recluster_turns),
          [](auto& o) -> auto& { return o.recluster_turns; }, 1, 1 << 20)
      .Choice("positions", "MODE",
              "at the model's context length: compact (re-position the cached tokens and go\n"
              "on; the default for a policy that evicts) or original (the session ends there)",
              [](auto& o) -> auto& { return o.positions; }, {"original", "compact"});
  return f;
}

flags::FlagSet<serving::CacheDefaults> SharedCacheFlags() {
  flags::FlagSet<serving::CacheDefaults> f;
  f.Section("every session")
      .String(
          "layer-budgets", "SPEC",
          "per-layer split of the budget: uniform (default), pyramid, a file with one\n"
          "weight per layer, or `recall calibrate`'s JSON profile",
          [](auto& o) -> auto& { return o.layer_budgets; })
      .Double(
          "layer-alpha", "A", "the JSON profile's exponent, in [0.5, 3] (default 1.2)",
          [](auto& o) -> auto& { return o.layer_alpha; }, 0.5, 3)
      .Double(
          "value-protection", "F",
          "keep this fraction of the budget for the tokens with the largest values (as\n"
          "VaSE), on any policy (default 0)",
          [](auto& o) -> auto& { return o.value_protection; }, 0, 0.99)
      .Double(
          "alpha-uniform", "K",
          "lazy+: a token is important when its attention is at least K times the\n"
          "uniform share 1/len of the cached tokens, instead of --alpha (default 0: off)",
          [](auto& o) -> auto& { return o.alpha_uniform; }, 0, 1e6)
      .Double(
          "attention-weight", "B",
          "lazy+: weight of the recent attention in a token's score (0: the recurrence\n"
          "score alone; default 3)",
          [](auto& o) -> auto& { return o.attention_weight; }, 0, 1e6)
      .Double(
          "attention-decay", "G",
          "lazy+: the recent attention is a sum decayed by G per step, in [0, 0.999]\n"
          "(default 0.9)",
          [](auto& o) -> auto& { return o.attention_decay; }, 0, 0.999)
      .Choice("meta-score", "NAME",
              "none (default) or caote: rank the policy's candidates by CAOTE, their score\n"
              "as attention times how far their value is from the attention output (h2o,\n"
              "tova, lazy, lazy+, snapkv; CPU ranks)",
              [](auto& o) -> auto& { return o.meta_score; }, {"none", "caote"})
      .Switch(
          "tp-verify",
          "debug: every eviction step checks that all ranks kept the same tokens; a\n"
          "mismatch fails the turn",
          [](auto& o) -> auto& { return o.verify_tp_keep; })
      .Field("verify_tp_keep");
  return f;
}

flags::FlagSet<serving::SchedulerOptions> SchedulingFlags() {
  flags::FlagSet<serving::SchedulerOptions> f;
  f.Section("scheduling")
      .Int(
          "max-batch-tokens", "N", "tokens per forward step (default 256)",
          [](auto& o) -> auto& { return o.max_batch_tokens; }, 1, 1 << 16)
      .Int(
          "prefill-chunk", "N", "prompt tokens per chunk, at most --max-batch-tokens (default 64)",
          [](auto& o) -> auto& { return o.prefill_chunk; }, 1, 1 << 16)
      .Int(
          "max-active", "N", "turns in the running batch (default 64)",
          [](auto& o) -> auto& { return o.max_active; }, 1, 4096)
      .Int(
          "max-queued", "N",
          "turns waiting to run (for a batch slot or for memory) before RESOURCE_EXHAUSTED\n"
          "(default 256)",
          [](auto& o) -> auto& { return o.max_queued; }, 0, 1 << 20)
      .Bytes(
          "host-cache-bytes", "SIZE", "host memory for offloaded idle sessions (default 4GiB)",
          [](auto& o) -> auto& { return o.host_cache_bytes; }, 0)
      .Check([](const serving::SchedulerOptions& o, const std::set<std::string>&) -> absl::Status {
        if (o.prefill_chunk > o.max_batch_tokens) {
          return absl::InvalidArgumentError(absl::StrCat("--prefill-chunk: ", o.prefill_chunk,
                                                         " is more than --max-batch-tokens (",
                                                         o.max_batch_tokens, ")"));
        }
        if (o.max_active > o.max_batch_tokens) {
          return absl::InvalidArgumentError(absl::StrCat(
              "--max-active: ", o.max_active, " running turns decode up to ", o.max_active,
              " tokens a step, more than --max-batch-tokens (", o.max_batch_tokens,
              "); lower --max-active or raise --max-batch-tokens"));
        }
        return absl::OkStatus();
      });
  return f;
}

const flags::FlagSet<WorkerOptions>& WorkerFlags() {
  static const flags::FlagSet<WorkerOptions>* const kFlags = [] {
    const serving::CacheDefaults kWorkerCacheDefaults;  // a worker's without --calibration
    auto* f = new flags::FlagSet<WorkerOptions>();
    f->Include(
         ModelFlags(), [](auto& o) -> auto& { return o.model; })
        .Choice("chat-format", "NAME",
                "chatml, llama2, llama3 or plain (default: guessed from the vocabulary)",
                [](auto& o) -> auto& { return o.chat_format; },
                {"chatml", "llama2", "llama3", "plain"})
        .Section("serving")
        .String(
            "listen", "HOST:PORT", "gRPC address (default 127.0.0.1:50051; port 0 picks one)",
            [](auto& o) -> auto& { return o.listen; })
        .Int(
            "metrics-port", "N",
            "Prometheus /metrics on the listen host's port N (default: off; 0 picks one)",
            [](auto& o) -> auto& { return o.metrics_port; }, 0, 65535)
        .String(
            "port-file", "PATH", "write \"grpc=PORT metrics=PORT\" here once listening",
            [](auto& o) -> auto& { return o.port_file; })
        .String(
            "coordinator", "HOST:PORT",
            "register with this coordinator (every 5 s, so a restarted coordinator finds\n"
            "this worker again)",
            [](auto& o) -> auto& { return o.coordinator; })
        .String(
            "served-model-name", "NAME",
            "the model's name for clients (Info, the OpenAI API's /v1/models and \"model\";\n"
            "default: the model path's last component, e.g. stories260K.bin)",
            [](auto& o) -> auto& { return o.served_model_name; })
        .Double(
            "shutdown-grace", "SECONDS",
            "on SIGTERM or SIGINT, running turns get this long to end while no new turn is\n"
            "taken (default 25: within Kubernetes' 30 s); a second signal ends them at once",
            [](auto& o) -> auto& { return o.shutdown_grace_seconds; }, 0, 86400)
        .String(
            "advertise", "HOST:PORT",
            "the address the coordinator dials (default: --listen's host, the bound port)",
            [](auto& o) -> auto& { return o.advertise; })
        .String(
            "cluster-token-file", "PATH",
            "the cluster token: this port then accepts only calls carrying it (tenants' API\n"
            "keys get PERMISSION_DENIED) and registering with --coordinator presents it\n"
            "(default: none, the port is open to anyone who reaches it; a warning at start)",
            [](auto& o) -> auto& { return o.cluster_token_file; })
        .Int(
            "max-tokens-limit", "N", "upper bound of a turn's max_tokens (default: the context)",
            [](auto& o) -> auto& { return o.max_tokens_limit; }, 1, 1 << 24)
        .Include(
            EngineFlags(), [](auto& o) -> auto& { return o.engine; })
        .Include(
            SchedulingFlags(), [](auto& o) -> auto& { return o.scheduler; })
        .Include(
            SessionCacheFlags(&kWorkerCacheDefaults), [](auto& o) -> auto& { return o.cache; })
        .String(
            "calibration", "FILE",
            "a `recall calibrate-window --out` file: its policy, budget fraction, window,\n"
            "alpha(s), value protection, meta score and layer budgets become the session\n"
            "defaults (the flags given here still win)",
            [](auto& o) -> auto& { return o.calibration_file; })
        .Include(
            SharedCacheFlags(), [](auto& o) -> auto& { return o.scheduler.cache; })
        .Short('m', "model");  // as recall serve and recall generate
    return f;
  }();
  return *kFlags;
}

absl::Status CheckServedModelName(const std::string& n) {
  if (n.size() > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("--served-model-name: at most 256 bytes, got ", n.size()));
  }
  for (const char c : n) {
    if (static_cast<unsigned char>(c) <= ' ' || c == 0x7F || c == '"' || c == '\\') {
      return absl::InvalidArgumentError(
          absl::StrCat("--served-model-name: \"", absl::CEscape(n),
                       "\" has a space, a control character, a quote or a backslash"));
    }
  }
  return absl::OkStatus();
}

std::string IgnoredBudgetFlags(const serving::CacheRequest& given,
                               const serving::CacheDefaults& resolved) {
  if (resolved.policy != "full") return "";
  std::vector<std::string> ignored;
  if (given.budget_tokens.has_value()) ignored.push_back("--budget");
  if (given.budget_fraction.has_value()) ignored.push_back("--budget-frac");
  if (given.window.has_value()) ignored.push_back("--window");
  if (given.alpha.has_value()) ignored.push_back("--alpha");
  if (resolved.layer_budgets != "uniform") ignored.push_back("--layer-budgets");
  return absl::StrJoin(ignored, ", ");
}

absl::Status ResolveWorkerOptions(WorkerOptions* o) {
  RECALL_RETURN_IF_ERROR(CheckServedModelName(o->served_model_name));
  o->engine.forward.max_batch_tokens = o->scheduler.max_batch_tokens;
  std::optional<serving::EvictionCalibration> calibration;
  if (!o->calibration_file.empty()) {
    absl::StatusOr<serving::EvictionCalibration> c =
        serving::ReadEvictionCalibration(o->calibration_file);
    if (!c.ok()) {
      return absl::Status(c.status().code(), absl::StrCat("--calibration: ", c.status().message()));
    }
    calibration = *c;
    o->scheduler.cache.window = c->window;
    o->scheduler.cache.alpha = c->alpha;
    // The policy and budget the calibration measured become the defaults too, so a model
    // served with its calibration runs what was measured for it.
    if (!c->policy.empty()) o->scheduler.cache.policy = c->policy;
    if (c->policy.empty() && o->scheduler.cache.policy == "full" && !o->cache.policy.has_value()) {
      RECALL_LOG(WARNING) << o->calibration_file << " names no \"policy\": sessions keep the "
                          << "default policy full, which does not evict (its alpha and window "
                          << "go unused); give --policy, or calibrate again to write one";
    }
    if (c->budget_fraction > 0) {
      o->scheduler.cache.budget_fraction = c->budget_fraction;
    }
  }
  o->scheduler.cache = o->scheduler.cache.With(o->cache);
  if (const std::string ignored = IgnoredBudgetFlags(o->cache, o->scheduler.cache);
      !ignored.empty()) {
    RECALL_LOG(WARNING) << ignored << ": no effect on sessions of policy full (the default "
                        << "policy here), which keep every token; give --policy (lazy+, lazy, "
                        << "...) for a cache that evicts";
  }
  if (calibration.has_value()) {
    // These are every session's (no per-session field): the file fills those still at their
    // defaults, so a value given beside it (other than the default) wins; the policy's own
    // settings only where the default policy is still the one the file measured.
    // Value protection and the meta score read cached values on the host: a GPU worker runs
    // the file's policy without them.
    serving::CacheDefaults& d = o->scheduler.cache;
    const bool cpu = o->engine.device == runtime::Device::kCpu;
    if (d.value_protection == 0 && cpu) d.value_protection = calibration->value_protection;
    if (d.policy == calibration->policy) {
      if (d.alpha_uniform == 0) d.alpha_uniform = calibration->alpha_uniform;
      if (d.layer_budgets == "uniform") d.layer_budgets = calibration->layer_budgets;
      if (d.meta_score == "none" && cpu) d.meta_score = calibration->meta_score;
    }
  }
  if (o->scheduler.cache.meta_score != "none" && o->engine.device != runtime::Device::kCpu) {
    return absl::InvalidArgumentError(
        "--meta-score: caote reads the cached values on the host; CPU ranks only (drop "
        "--device cuda or --meta-score)");
  }
  if (o->scheduler.cache.value_protection > 0 && o->engine.device != runtime::Device::kCpu) {
    return absl::InvalidArgumentError(
        "--value-protection: reads the cached values on the host; CPU ranks only (drop "
        "--device cuda or --value-protection)");
  }
  if (o->scheduler.cache.policy == "episodic" &&
      (o->engine.tp > 1 || o->engine.device != runtime::Device::kCpu)) {
    return absl::InvalidArgumentError(
        "--policy episodic: runs on one CPU rank (its block-wise build scores keys on the "
        "host); drop --tp and --device");
  }
  return absl::OkStatus();
}

absl::Status ApplyModel(const model::ModelConfig& config, const model::Tokenizer& tokenizer,
                        bool hf_tokenizer, WorkerOptions* o) {
  serving::SchedulerOptions& s = o->scheduler;
  s.chat_format = model::GuessChatFormat(tokenizer);
  if (o->chat_format.has_value()) {
    RECALL_ASSIGN_OR_RETURN(s.chat_format, model::ParseChatFormat(*o->chat_format));
    if (const std::string misfit = model::ChatFormatMisfit(s.chat_format, tokenizer);
        !misfit.empty()) {
      RECALL_LOG(WARNING) << "--chat-format " << *o->chat_format << ": " << misfit;
    }
  }
  const model::ReplyStops stops =
      model::StopsFor(s.chat_format, tokenizer, /*bos_ends_sequence=*/!hf_tokenizer, true);
  s.stop_token_ids = stops.token_ids;
  s.stop_strings = stops.strings;
  s.limits.max_tokens = config.max_seq_len;
  if (o->max_tokens_limit.has_value()) {
    if (*o->max_tokens_limit > config.max_seq_len) {
      return absl::InvalidArgumentError(absl::StrCat("--max-tokens-limit: ", *o->max_tokens_limit,
                                                     " is more than the model's context length (",
                                                     config.max_seq_len, ")"));
    }
    s.limits.max_tokens = *o->max_tokens_limit;
  }
  return absl::OkStatus();
}

}  // namespace recall::service
