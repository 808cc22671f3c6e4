// `recall generate` runs the model in-process (no coordinator, no worker): the quickest way
// to see a model work. It runs on the same Engine as the worker, and its session cache is
// made by the worker's CacheFactory from the same flags, so a policy means the same here as
// in `recall serve`.
#include "cli/generate_command.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <optional>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cli/sampling_flags.h"
#include "common/flags.h"
#include "common/status.h"
#include "common/utf8.h"
#include "kernels/sampling_params.h"
#include "worker/model/chat_stops.h"
#include "worker/model/chat_template.h"
#include "worker/model/load.h"
#include "worker/offline/episodic_sequence.h"
#include "worker/offline/generator.h"
#include "worker/offline/tp_sequence.h"
#include "worker/runtime/engine.h"
#include "worker/service/worker_options.h"
#include "worker/serving/cache_factory.h"
#include "worker/serving/turn_request.h"

namespace recall::cli {
namespace {

constexpr char kUsageHead[] = R"(usage: recall generate --model PATH [options]

Loads the model in this process and prints the text it generates from --prompt.
--policy episodic treats the prompt's sentences as the history: they are clustered into
episodes, each compressed block-wise to the budget, and the last sentence is answered from
its episode (decoding with lazy).

)";

struct GenerateCliOptions {
  model::LoadOptions model;
  std::string prompt;
  int max_tokens = 256;
  SamplingFlags sampling;  // unset: kernels::SamplingParams' defaults; the seed from the clock
  std::vector<std::string> stop;
  bool chat = false;
  std::optional<std::string> chat_format;
  std::string system;
  int recent = 4;  // episodic: sentences before the last kept uncompressed
  bool echo = false;
  bool stats = false;
  runtime::EngineOptions engine;
  serving::CacheRequest cache;
  serving::CacheDefaults shared;
  // The KV pool: unset (neither its bytes nor its fraction given), one full context.
  bool pool_fraction_given = false;
  GenerateCliOptions() {
    shared.budget_tokens = 256;  // one sequence: a smaller default budget than a worker's
    engine.forward.max_batch_tokens = 256;
  }
};

const flags::FlagSet<GenerateCliOptions>& GenerateFlags() {
  static const flags::FlagSet<GenerateCliOptions>* const kFlags = [] {
    const GenerateCliOptions defaults;
    auto* f = new flags::FlagSet<GenerateCliOptions>();
    f->Include(
         service::ModelFlags(), [](auto& o) -> auto& { return o.model; })
        .Section("generation")
        .Text(
            "prompt", "TEXT", "the prompt (default: empty; a llama2.c model starts from BOS)",
            [](auto& o) -> auto& { return o.prompt; })
        .Int(
            "max-tokens", "N", "tokens to generate at most (default 256)",
            [](auto& o) -> auto& { return o.max_tokens; }, 1, 1 << 20)
        .List(
            "stop", "TEXT", "stop before this text (repeatable)",
            [](auto& o) -> auto& { return o.stop; })
        .Check([](const GenerateCliOptions& o, const std::set<std::string>&) -> absl::Status {
          for (const std::string& s : o.stop) {
            if (s.empty())
              return absl::InvalidArgumentError("--stop: empty; give the text to stop at");
          }
          return absl::OkStatus();
        })
        .Switch(
            "chat", "wrap the prompt in the model's chat template",
            [](auto& o) -> auto& { return o.chat; })
        .Choice("chat-format", "NAME",
                "chatml, llama2, llama3 or plain (default: guessed from the vocabulary; implies\n"
                "--chat)",
                [](auto& o) -> auto& { return o.chat_format; },
                {"chatml", "llama2", "llama3", "plain"})
        .Text(
            "system", "TEXT", "system message for --chat",
            [](auto& o) -> auto& { return o.system; })
        .Switch(
            "echo", "print the prompt before the generated text",
            [](auto& o) -> auto& { return o.echo; })
        .Switch(
            "stats",
            "print the engine (device, weight and KV types), token counts and speed to\n"
            "stderr, and the kv: line (KV bytes, evictions), which a policy that evicts\n"
            "prints anyway",
            [](auto& o) -> auto& { return o.stats; })
        .Include(
            SamplingFlagSet(), [](auto& o) -> auto& { return o.sampling; })
        .Include(
            service::EngineFlags(), [](auto& o) -> auto& { return o.engine; })
        .Include(service::SessionCacheFlags(&defaults.shared),
                 [](auto& o) -> auto& { return o.cache; }, {"recluster-turns"})
        .Int(
            "recent", "N", "episodic: sentences before the last kept uncompressed (default 4)",
            [](auto& o) -> auto& { return o.recent; }, 0, 1 << 20)
        .Include(
            service::SharedCacheFlags(), [](auto& o) -> auto& { return o.shared; })
        .Short('m', "model")
        .Short('p', "prompt")
        .Short('n', "max-tokens")
        .Short('s', "seed")
        .Short('t', "threads");
    return f;
  }();
  return *kFlags;
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

absl::Status Run(GenerateCliOptions o) {
  const flags::FlagSet<GenerateCliOptions>& flags = GenerateFlags();
  // As a server refuses such a message (its tokens would be the bytes' fallbacks).
  if (!utf8::IsValid(o.prompt)) return absl::InvalidArgumentError("--prompt: is not valid UTF-8");
  if (!utf8::IsValid(o.system)) return absl::InvalidArgumentError("--system: is not valid UTF-8");
  const serving::CacheDefaults cache_settings = o.shared.With(o.cache);
  if (const std::string ignored = service::IgnoredBudgetFlags(o.cache, cache_settings);
      !ignored.empty()) {
    std::cerr << "recall generate: warning: " << ignored
              << ": no effect with policy full (the default), which keeps every token; give "
                 "--policy (lazy+, lazy, ...) to evict\n";
  }
  const bool episodic = cache_settings.policy == "episodic";
  if (episodic && (o.engine.tp > 1 || o.engine.device != runtime::Device::kCpu)) {
    return absl::InvalidArgumentError(
        "--policy episodic: runs on one CPU rank for now (its block-wise prefill scores keys on "
        "the host); drop --tp and --device");
  }
  absl::StatusOr<model::Loaded> loaded = model::LoadAll(o.model);
  if (!loaded.ok()) return flags.Explain(loaded.status());
  const model::ModelConfig& config = loaded->model->config;
  const model::Tokenizer& tok = *loaded->tokenizer;
  // The session's cache, as a worker would make it from the same settings.
  absl::StatusOr<serving::CacheFactory> factory =
      serving::CacheFactory::Create(cache_settings, config, config.n_kv_heads, o.engine.tp);
  if (!factory.ok()) return flags.Explain(factory.status());
  RECALL_ASSIGN_OR_RETURN(const serving::SessionCacheSpec spec, factory->Resolve({}, 0));

  offline::GenerateOptions options;
  options.max_tokens = o.max_tokens;
  options.sampling.seed = static_cast<uint64_t>(
      std::chrono::steady_clock::now().time_since_epoch().count() & 0x7fffffff);
  ApplySampling(o.sampling, &options.sampling);
  // As a server checks them (a --top-k above the vocabulary was taken as off), said by flag.
  RECALL_RETURN_IF_ERROR(
      InFlagTerms(serving::ValidateSampling(options.sampling, "sampling.", config.vocab_size)));
  options.stop_strings = o.stop;
  options.eviction = spec.evictor;
  options.positions = spec.positions;
  options.prefill_chunk = 256;
  const bool chat = o.chat || o.chat_format.has_value();
  model::ChatFormat format = model::GuessChatFormat(tok);
  if (o.chat_format.has_value()) {
    RECALL_ASSIGN_OR_RETURN(format, model::ParseChatFormat(*o.chat_format));
    if (const std::string misfit = model::ChatFormatMisfit(format, tok); !misfit.empty()) {
      std::cerr << "recall generate: warning: --chat-format " << *o.chat_format << ": " << misfit
                << "\n";
    }
  }
  std::string prompt_text = o.prompt;
  if (chat) {
    std::vector<model::ChatMessage> messages;
    if (!o.system.empty()) messages.push_back({"system", o.system});
    messages.push_back({"user", prompt_text});
    RECALL_ASSIGN_OR_RETURN(prompt_text, model::RenderChat(format, messages, true));
  }
  // llama2.c convention (run.c): a BOS token delimits sequences, so it ends the output.
  const model::ReplyStops stops =
      model::StopsFor(format, tok, /*bos_ends_sequence=*/!loaded->hf_tokenizer, chat);
  options.stop_token_ids = stops.token_ids;
  options.stop_strings.insert(options.stop_strings.end(), stops.strings.begin(),
                              stops.strings.end());
  const std::vector<int32_t> prompt = tok.Encode(prompt_text, /*add_bos=*/!loaded->hf_tokenizer);
  if (prompt.empty()) {
    return absl::InvalidArgumentError(
        "--prompt: empty, and the tokenizer has no BOS to start from");
  }

  // Default pool: one full context in every layer (a fraction, when given, as the worker's).
  const bool full_context_pool = !o.engine.kv_cache_bytes.has_value() && !o.pool_fraction_given;
  if (full_context_pool) {
    o.engine.kv_cache_bytes =
        runtime::FullContextKvBytes(config, o.engine.block_tokens, o.engine.kv_dtype) +
        4096 * o.engine.tp;
  }
  absl::StatusOr<std::unique_ptr<runtime::Engine>> created =
      runtime::Engine::Create(*loaded->model, o.engine);
  if (!created.ok() && full_context_pool && absl::IsResourceExhausted(created.status()) &&
      absl::StrContains(created.status().message(), "block pool: cannot allocate")) {
    // The pool sized by the context could not be had (BlockPool's words): say so, and what
    // sizes it instead (a model claiming a context of millions asked for tens of GB, naming
    // neither). Other errors (weights too large for the device, a weight type it lacks, no
    // CUDA device) are the flags' to explain.
    return absl::Status(
        created.status().code(),
        absl::StrCat(created.status().message(), " (the default pool holds one full context of ",
                     config.max_seq_len, " tokens; give --kv-cache-bytes or --kv-cache-fraction)"));
  }
  if (!created.ok()) return flags.Explain(created.status());
  runtime::Engine& engine = **created;
  // What runs (the device, the weights' and the KV's types), as a worker's start-up line says.
  if (o.stats) std::fprintf(stderr, "engine: %s\n", engine.Summary().c_str());

  if (o.echo) std::cout << tok.Decode(prompt) << std::flush;
  const auto print = [](const std::string& delta) { std::cout << delta << std::flush; };
  offline::GenerateResult result;
  std::optional<offline::EpisodicStats> episodic_stats;
  if (engine.tp() > 1) {
    RECALL_ASSIGN_OR_RETURN(
        std::unique_ptr<offline::TpSequence> seq,
        offline::TpSequence::Create(*engine.group(), spec.evictor, options.positions));
    RECALL_ASSIGN_OR_RETURN(
        result, offline::Generate(*seq, engine.backend(0), config, tok, prompt, options, print));
  } else if (episodic) {
    offline::EpisodicOptions eo;
    eo.decode = *spec.evictor;
    // --tp-eviction head-adaptive: the episodes' block-wise compression chooses over all KV
    // heads of a layer as well.
    eo.block.head_adaptive = eo.decode.budget.head_adaptive;
    eo.episodes = spec.episodes;
    eo.block.block_tokens = spec.block_tokens;
    eo.embedder = spec.embedder;
    eo.recent_utterances = o.recent;
    RECALL_ASSIGN_OR_RETURN(
        std::unique_ptr<offline::EpisodicSequence> seq,
        offline::EpisodicSequence::Create(engine.forward(0), engine.pool(0), tok, eo));
    RECALL_ASSIGN_OR_RETURN(
        result, offline::Generate(*seq, engine.backend(0), config, tok, prompt, options, print));
    episodic_stats = seq->episodic_stats();
  } else {
    RECALL_ASSIGN_OR_RETURN(
        result, offline::Generate(engine.forward(0), engine.pool(0), tok, prompt, options, print));
  }
  std::cout << std::endl;
  if (o.stats && episodic_stats.has_value()) PrintEpisodes(*episodic_stats);
  if (o.stats || spec.evictor.has_value()) {
    std::fprintf(stderr,
                 "kv: policy=%s peak_kv_bytes=%lld final_kv_bytes=%lld evictions=%lld "
                 "evicted_slots=%lld\n",
                 spec.policy.c_str(), static_cast<long long>(result.peak_kv_bytes),
                 static_cast<long long>(result.final_kv_bytes),
                 static_cast<long long>(result.evictions),
                 static_cast<long long>(result.evicted_slots));
  }
  if (o.stats) {
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
  for (const std::string& a : argv) {
    if (a == "--help" || a == "-h") {
      std::cout << kUsageHead << GenerateFlags().Help();
      return 0;
    }
  }
  GenerateCliOptions options;
  std::set<std::string> given;
  if (absl::Status st = GenerateFlags().Parse(argv, &options, &given); !st.ok()) {
    std::cerr << "recall generate: " << st.message()
              << " (recall generate --help lists the flags)\n";
    return 2;
  }
  options.pool_fraction_given = given.count("kv-cache-fraction") > 0;
  const absl::Status st = Run(std::move(options));
  if (!st.ok()) {
    std::cerr << "recall generate: " << st.message() << "\n";
    return st.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  return 0;
}

}  // namespace recall::cli
