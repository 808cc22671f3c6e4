// `recall generate` runs the engine in-process (no coordinator, no worker): the quickest
// way to see a model work. The serving path (`recall serve`) comes with the worker issue.
#include "cli/generate_command.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cache/block_pool.h"
#include "common/args.h"
#include "common/status.h"
#include "kernels/backend.h"
#include "kernels/cuda_backend.h"
#include "worker/model/chat_stops.h"
#include "worker/model/chat_template.h"
#include "worker/model/load_from_flags.h"
#include "worker/model/loader.h"
#include "worker/model/upload.h"
#include "worker/offline/episodic_sequence.h"
#include "worker/offline/generator.h"
#include "worker/offline/tp_sequence.h"
#include "worker/runtime/forward.h"
#include "worker/runtime/tp/tp_group.h"
#include "worker/tokenizer/tokenizer.h"

namespace recall::cli {
namespace {

constexpr char kUsage[] = R"(usage: recall generate --model PATH [options]

  --model PATH            a llama2.c checkpoint (.bin) or a Hugging Face directory
  --tokenizer PATH        tokenizer.bin (llama2.c), tokenizer.model or tokenizer.json;
                          default: the one inside a Hugging Face directory
  --prompt TEXT           the prompt (default: empty; a llama2.c model starts from BOS)
  --max-tokens N          tokens to generate at most (default 256)
  --temperature T         0 = greedy (default 1.0)
  --top-p P               nucleus sampling mass in (0, 1] (default 0.9)
  --top-k K               keep the K most likely tokens, 0 = off (default 0)
  --repetition-penalty R  > 1 discourages repeats (default 1.0)
  --seed S                sampling seed (default: from the clock)
  --stop TEXT             stop before this text (repeatable)
  --chat                  wrap the prompt in the model's chat template
  --chat-format NAME      chatml, llama2, llama3 or plain (default: guessed from the vocab)
  --system TEXT           system message for --chat
  --threads N             CPU threads (default: all cores)
  --kv-cache-mb MB        KV block pool size (default: one full context)
  --policy NAME           KV eviction: full (default), streaming, h2o, tova, lazy, vase,
                          rkv (while decoding), snapkv (the prompt, after prefill),
                          episodic (EpiCache: the prompt's sentences are clustered into
                          episodes, each compressed block-wise to the budget; the last
                          sentence is answered from its episode, decoding with lazy)
  --episodes N            episodic: episodes at most (default 4)
  --embedder NAME         episodic: model (mean-pooled hidden states, default) or tfidf
  --block-tokens N        episodic: history + patch tokens per prefill block (default 2048)
  --recent N              episodic: sentences before the last kept uncompressed (default 4)
  --budget N              KV budget in tokens per layer and KV head (default 256)
  --budget-frac F         KV budget as a fraction of the sequence length, in (0, 1]
  --window W              eviction window (lazy: evict every W steps, keep the last W;
                          h2o: recent window) (default 32)
  --alpha A               lazy importance threshold (default 1e-4)
  --layer-budgets SPEC    uniform (default), pyramid, a file with one weight per layer,
                          or a sensitivity profile (JSON) from `recall calibrate`
  --layer-alpha A         a sensitivity profile's exponent: layer l weighs
                          (1 - normalised sigma_l)^A, in [0.5, 3] (default 1.2)
  --value-protection F    keep this fraction of the budget for the largest-value tokens
  --tp N                  tensor parallelism: run on N ranks (CPU ranks are threads; N must
                          divide the query heads and the MLP width) (default 1)
  --device NAME           cpu (default) or cuda
  --devices LIST          CUDA device ordinals, one per rank (default 0..N-1); an ordinal may
                          repeat with --tp-comm staged
  --tp-comm KIND          how CUDA ranks all-reduce activations: nccl (default; distinct
                          GPUs) or staged (through host memory; ranks may share a GPU)
  --tp-eviction MODE      how ranks (and heads) agree on evictions: uniform (per-head counts,
                          default), shared (one token set per layer), head-adaptive (Ada-KV
                          global top-k over all KV heads)
  --tp-verify             check every step that all ranks kept the same tokens (debug)
  --echo                  print the prompt before the generated text
  --stats                 print token counts, speed, KV bytes and evictions to stderr
)";

absl::StatusOr<std::optional<cache::eviction::SessionEvictorOptions>> EvictionFromArgs(
    const Args& args) {
  const std::string policy = args.GetString("policy", "full");
  if (policy == "full" && !args.Has("budget") && !args.Has("budget-frac")) return std::nullopt;
  if (args.Has("budget") && args.Has("budget-frac")) {
    return absl::InvalidArgumentError("--budget and --budget-frac are exclusive; give one");
  }
  cache::eviction::SessionEvictorOptions o;
  // Episodic compression decodes with lazy eviction (EpiCache + LazyEviction).
  o.policy.name = policy == "episodic" ? "lazy" : policy;
  RECALL_ASSIGN_OR_RETURN(const int64_t window, args.GetInt("window", 32, 1, 1 << 20));
  o.policy.window = static_cast<int>(window);
  RECALL_ASSIGN_OR_RETURN(const double alpha, args.GetDouble("alpha", 1e-4, 0, 1));
  o.policy.alpha = static_cast<float>(alpha);
  RECALL_ASSIGN_OR_RETURN(const double vp, args.GetDouble("value-protection", 0, 0, 0.99));
  o.policy.value_protection = static_cast<float>(vp);
  if (args.Has("budget-frac")) {
    RECALL_ASSIGN_OR_RETURN(const double f, args.GetDouble("budget-frac", 1, 1e-6, 1));
    o.budget.unit = cache::eviction::BudgetOptions::Unit::kFraction;
    o.budget.budget = f;
  } else {
    RECALL_ASSIGN_OR_RETURN(const int64_t c, args.GetInt("budget", 256, 1, 1 << 24));
    o.budget.budget = static_cast<double>(c);
  }
  if (policy == "episodic" && o.budget.unit == cache::eviction::BudgetOptions::Unit::kFraction) {
    return absl::InvalidArgumentError("--budget-frac: episodic needs --budget in tokens");
  }
  absl::Status mode =
      cache::eviction::ApplyTpEvictionMode(args.GetString("tp-eviction", "uniform"), o);
  if (!mode.ok())
    return absl::InvalidArgumentError(absl::StrCat("--tp-eviction: ", mode.message()));
  o.verify_keep = args.Has("tp-verify");
  RECALL_ASSIGN_OR_RETURN(const double layer_alpha, args.GetDouble("layer-alpha", 1.2, 0.5, 3));
  cache::eviction::ApplyLayerBudgets(args.GetString("layer-budgets", "uniform"), layer_alpha,
                                     &o.budget);
  return o;
}

absl::StatusOr<offline::EpisodicOptions> EpisodicFromArgs(
    const Args& args, const cache::eviction::SessionEvictorOptions& decode) {
  offline::EpisodicOptions o;
  o.decode = decode;
  // --tp-eviction head-adaptive: the episodes' block-wise compression chooses over all KV
  // heads of a layer as well.
  o.block.head_adaptive = decode.budget.head_adaptive;
  RECALL_ASSIGN_OR_RETURN(const int64_t episodes, args.GetInt("episodes", 4, 1, 64));
  RECALL_ASSIGN_OR_RETURN(const int64_t block, args.GetInt("block-tokens", 2048, 2, 1 << 20));
  RECALL_ASSIGN_OR_RETURN(const int64_t recent, args.GetInt("recent", 4, 0, 1 << 20));
  o.episodes = static_cast<int>(episodes);
  o.block.block_tokens = static_cast<int>(block);
  o.recent_utterances = static_cast<int>(recent);
  o.embedder = args.GetString("embedder", "model");
  const std::vector<std::string>& names = offline::EpisodicEmbedders();
  if (std::find(names.begin(), names.end(), o.embedder) == names.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--embedder: '", o.embedder, "' is not one of ", absl::StrJoin(names, ", ")));
  }
  return o;
}

void PrintEpisodes(const offline::EpisodicStats& s) {
  if (s.active < 0) {
    std::fprintf(stderr, "episodic: history within the budget; not clustered\n");
    return;
  }
  std::fprintf(stderr,
               "episodic: history_tokens=%d recent_tokens=%d episodes=%zu active=%d%s "
               "embed_s=%.3f build_s=%.3f build_peak_kv_bytes=%lld\n",
               s.history_tokens, s.recent_tokens, s.episodes.size(), s.active,
               s.routed_by_fallback ? " (fallback: most recent)" : "", s.embed_seconds,
               s.build_seconds, static_cast<long long>(s.build_peak_bytes));
  for (size_t e = 0; e < s.episodes.size(); ++e) {
    std::fprintf(stderr, "  episode %zu: windows=%d patch_tokens=%d kv_bytes=%lld (%s)\n", e,
                 static_cast<int>(s.episodes[e].windows.size()), s.episodes[e].patch_tokens,
                 static_cast<long long>(s.episodes[e].kv_bytes),
                 s.episodes[e].resident ? "device" : "host");
  }
}

absl::Status Run(const Args& args) {
  if (!args.Has("model")) return absl::InvalidArgumentError("--model is required");
  RECALL_ASSIGN_OR_RETURN(const int64_t max_tokens, args.GetInt("max-tokens", 256, 1, 1 << 20));
  RECALL_ASSIGN_OR_RETURN(const double temperature, args.GetDouble("temperature", 1.0, 0, 100));
  RECALL_ASSIGN_OR_RETURN(const double top_p, args.GetDouble("top-p", 0.9, 1e-6, 1.0));
  RECALL_ASSIGN_OR_RETURN(const int64_t top_k, args.GetInt("top-k", 0, 0, 1 << 20));
  RECALL_ASSIGN_OR_RETURN(const double rep, args.GetDouble("repetition-penalty", 1.0, 1e-3, 100));
  const int64_t clock_seed = std::chrono::steady_clock::now().time_since_epoch().count();
  RECALL_ASSIGN_OR_RETURN(const int64_t seed,
                          args.GetInt("seed", clock_seed & 0x7fffffff, 0, INT64_MAX));
  RECALL_ASSIGN_OR_RETURN(const int64_t threads, args.GetInt("threads", 0, 0, 1024));
  RECALL_ASSIGN_OR_RETURN(const int64_t kv_mb, args.GetInt("kv-cache-mb", 0, 0, 1 << 24));
  RECALL_ASSIGN_OR_RETURN(const int64_t tp, args.GetInt("tp", 1, 1, 64));
  const std::string device = args.GetString("device", "cpu");
  std::vector<int> devices;
  if (args.Has("devices")) {
    RECALL_ASSIGN_OR_RETURN(devices, runtime::tp::ParseDevices(args.GetString("devices")));
  }
  const std::string tp_comm = args.GetString("tp-comm", "");
  RECALL_RETURN_IF_ERROR(
      runtime::tp::CheckDeviceFlags(device, static_cast<int>(tp), devices, tp_comm));

  RECALL_ASSIGN_OR_RETURN(std::optional<cache::eviction::SessionEvictorOptions> eviction,
                          EvictionFromArgs(args));
  RECALL_ASSIGN_OR_RETURN(model::Loaded loaded, model::LoadAll(args));
  const model::ModelConfig& config = loaded.model->config;
  const model::Tokenizer& tok = *loaded.tokenizer;

  std::string prompt_text = args.GetString("prompt");
  offline::GenerateOptions options;
  options.max_tokens = static_cast<int>(max_tokens);
  options.sampling.temperature = static_cast<float>(temperature);
  options.sampling.top_p = static_cast<float>(top_p);
  options.sampling.top_k = static_cast<int>(top_k);
  options.sampling.repetition_penalty = static_cast<float>(rep);
  options.sampling.seed = static_cast<uint64_t>(seed);
  options.stop_strings = args.GetAll("stop");
  options.eviction = eviction;
  const bool chat = args.Has("chat") || args.Has("chat-format");
  model::ChatFormat format = model::GuessChatFormat(tok);
  if (args.Has("chat-format")) {
    RECALL_ASSIGN_OR_RETURN(format, model::ParseChatFormat(args.GetString("chat-format")));
  }
  if (chat) {
    std::vector<model::ChatMessage> messages;
    if (args.Has("system")) messages.push_back({"system", args.GetString("system")});
    messages.push_back({"user", prompt_text});
    RECALL_ASSIGN_OR_RETURN(prompt_text, model::RenderChat(format, messages, true));
  }
  // llama2.c convention (run.c): a BOS token delimits sequences, so it ends the output.
  const model::ReplyStops stops =
      model::StopsFor(format, tok, /*bos_ends_sequence=*/!loaded.hf_tokenizer, chat);
  options.stop_token_ids = stops.token_ids;
  options.stop_strings.insert(options.stop_strings.end(), stops.strings.begin(),
                              stops.strings.end());
  const std::vector<int32_t> prompt = tok.Encode(prompt_text, /*add_bos=*/!loaded.hf_tokenizer);
  if (prompt.empty()) {
    return absl::InvalidArgumentError(
        "--prompt: empty, and the tokenizer has no BOS to start from");
  }

  if (args.Has("echo")) {
    std::cout << tok.Decode(prompt) << std::flush;
  }
  const auto print = [](const std::string& delta) { std::cout << delta << std::flush; };
  options.prefill_chunk = 256;
  kernels::PagedKvLayout layout{config.n_layers, config.n_kv_heads, config.head_dim, 16};
  // Default pool: one full context in every layer (a block holds one layer's slots).
  const int64_t full_context_blocks =
      layout.n_layers * ((config.max_seq_len + layout.block_tokens - 1) / layout.block_tokens);
  offline::GenerateResult result;
  std::optional<offline::EpisodicStats> episodic_stats;
  const bool episodic = args.GetString("policy", "full") == "episodic";
  if (episodic && (tp > 1 || device != "cpu")) {
    return absl::InvalidArgumentError(
        "--policy episodic: runs on one CPU rank for now (its block-wise prefill scores keys on "
        "the host); drop --tp and --device");
  }
  if (tp > 1) {
    runtime::tp::TpGroupOptions go;
    go.tp = static_cast<int>(tp);
    go.device = device;
    go.devices = devices;
    go.collectives = tp_comm;
    if (threads > 0) go.threads_per_rank = std::max<int>(1, static_cast<int>(threads / tp));
    go.kv_bytes_per_rank =
        kv_mb > 0 ? (kv_mb << 20) / tp : full_context_blocks * layout.BlockFloats() * 4 / tp + 4096;
    go.forward.max_batch_tokens = 256;
    absl::StatusOr<std::unique_ptr<runtime::tp::TpGroup>> created =
        runtime::tp::TpGroup::Create(*loaded.model, go);
    if (!created.ok()) return runtime::tp::WithFlagNames(created.status());
    std::unique_ptr<runtime::tp::TpGroup> group = *std::move(created);
    RECALL_ASSIGN_OR_RETURN(std::unique_ptr<offline::TpSequence> seq,
                            offline::TpSequence::Create(*group, eviction));
    RECALL_ASSIGN_OR_RETURN(
        result, offline::Generate(*seq, group->backend(0), config, tok, prompt, options, print));
  } else {
    // One device: the CPU backend on the loaded weights, or the CUDA backend on a device copy.
    std::unique_ptr<kernels::Backend> backend;
    std::unique_ptr<model::Model> uploaded;
    const model::Model* weights = loaded.model.get();
    if (device == "cuda") {
      RECALL_ASSIGN_OR_RETURN(backend,
                              kernels::CreateCudaBackend({devices.empty() ? 0 : devices[0]}));
      RECALL_ASSIGN_OR_RETURN(uploaded, model::UploadModel(*loaded.model, backend->memory()));
      weights = uploaded.get();
    } else {
      backend = kernels::CreateCpuBackend({static_cast<int>(threads)});
    }
    std::unique_ptr<cache::BlockPool> pool;
    if (kv_mb > 0) {
      RECALL_ASSIGN_OR_RETURN(
          pool, cache::BlockPool::CreateWithBytes(layout, kv_mb << 20, backend->memory()));
    } else {
      RECALL_ASSIGN_OR_RETURN(
          pool, cache::BlockPool::Create(layout, full_context_blocks, backend->memory()));
    }
    runtime::ForwardPass forward(*weights, *backend, {256});
    if (episodic) {
      RECALL_ASSIGN_OR_RETURN(offline::EpisodicOptions eo, EpisodicFromArgs(args, *eviction));
      RECALL_ASSIGN_OR_RETURN(std::unique_ptr<offline::EpisodicSequence> seq,
                              offline::EpisodicSequence::Create(forward, *pool, tok, eo));
      RECALL_ASSIGN_OR_RETURN(
          result, offline::Generate(*seq, *backend, config, tok, prompt, options, print));
      episodic_stats = seq->episodic_stats();
    } else {
      RECALL_ASSIGN_OR_RETURN(result,
                              offline::Generate(forward, *pool, tok, prompt, options, print));
    }
  }
  std::cout << std::endl;
  if (args.Has("stats") && episodic_stats.has_value()) PrintEpisodes(*episodic_stats);
  if (args.Has("stats") || eviction.has_value()) {
    std::fprintf(
        stderr,
        "kv: policy=%s peak_kv_bytes=%lld final_kv_bytes=%lld evictions=%lld "
        "evicted_slots=%lld\n",
        eviction ? args.GetString("policy", "full").c_str() : "full",
        static_cast<long long>(result.peak_kv_bytes), static_cast<long long>(result.final_kv_bytes),
        static_cast<long long>(result.evictions), static_cast<long long>(result.evicted_slots));
  }
  if (args.Has("stats")) {
    const int n = static_cast<int>(result.tokens.size());
    std::fprintf(stderr,
                 "prompt_tokens=%d generated_tokens=%d finish=%s prefill_tok_s=%.1f "
                 "decode_tok_s=%.1f\n",
                 result.prompt_tokens, n, offline::FinishReasonName(result.finish_reason),
                 result.prompt_tokens / std::max(result.prefill_seconds, 1e-9),
                 n / std::max(result.decode_seconds, 1e-9));
  }
  return absl::OkStatus();
}

}  // namespace

int RunGenerate(const std::vector<std::string>& argv) {
  absl::StatusOr<Args> args = Args::Parse(argv, {"model",       "tokenizer",
                                                 "prompt",      "max-tokens",
                                                 "temperature", "top-p",
                                                 "top-k",       "repetition-penalty",
                                                 "seed",        "stop",
                                                 "chat-format", "system",
                                                 "threads",     "kv-cache-mb",
                                                 "policy",      "budget",
                                                 "budget-frac", "window",
                                                 "alpha",       "layer-budgets",
                                                 "layer-alpha", "value-protection",
                                                 "tp",          "device",
                                                 "devices",     "tp-comm",
                                                 "tp-eviction", "episodes",
                                                 "embedder",    "block-tokens",
                                                 "recent"},
                                          {"chat", "echo", "stats", "help", "tp-verify"});
  if (!args.ok()) {
    std::cerr << "recall generate: " << args.status().message() << "\n\n" << kUsage;
    return 2;
  }
  if (args->Has("help")) {
    std::cout << kUsage;
    return 0;
  }
  absl::Status st = Run(*args);
  if (!st.ok()) {
    std::cerr << "recall generate: " << st.message() << "\n";
    return st.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}

}  // namespace recall::cli
