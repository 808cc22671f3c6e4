// Speed benchmark of the CPU runtime: decode tokens/s at batch 1 and 8 and prefill tokens/s
// for a random-weight model with the shape of SmolLM2-135M (../shared/tokenizers/smollm2/
// config.json) or a named shape (--shape, bench/shapes.h), in fp32, bf16 and int8 weights
// (int8: the bf16 model quantized at load, worker/model/quantize.h). Baselines measured in
// the same run:
//   - memory bandwidth (STREAM-like copy) -> the decode roofline: bandwidth / bytes per token
//   - cblas_sgemm GFLOP/s at a prefill-like shape -> the prefill target
//   - the bf16 rows -> int8's speed-ups (int8/bf16)
// Targets: batch-1 decode >= 70% of the roofline; prefill >= 60% of sgemm; int8 decode >=
// 1.8x bf16 and >= 90% of its roofline, int8 prefill >= 1.5x bf16.
// Memory, per weight type: the bytes the weights hold (resident growth of a child process
// that makes, and for int8 quantizes, the model) and the sessions of --session-tokens
// tokens (FullKV, bf16 KV, the pool's own block bytes) that fit beside them in --budget-gib.
//
// usage: recall_speed_bench [--config PATH | --shape NAME] [--threads N] [--steps N]
//                           [--prompt N] [--dtypes f32,bf16,int8,int8-head] [--policies 0|1]
//                           [--budget-gib G] [--session-tokens N]
#include <malloc.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <string>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/bench_util.h"
#include "bench/policy_overhead.h"
#include "bench/shapes.h"
#include "cache/block_pool.h"
#include "common/clock.h"
#include "common/flags.h"
#include "kernels/backend.h"
#include "kernels/cpu/int8.h"
#include "worker/model/quantize.h"
#include "worker/model/random_model.h"
#include "worker/runtime/forward.h"

namespace recall::bench {
namespace {

struct Flags {
  std::string config = std::string(RECALL_SHARED_DIR_DEFAULT) + "/tokenizers/smollm2/config.json";
  int threads = 0;
  int steps = 32;
  int prompt = 512;
  std::string shape;  // a bench/shapes.h name instead of --config
  std::string dtypes = "f32,bf16,int8";
  bool policies = true;  // the eviction overhead table after the weight types
  double budget_gib = 4;      // the memory table's fixed budget
  int session_tokens = 4096;  // and its sessions' length
};

const flags::FlagSet<Flags>& SpeedFlags() {
  static const flags::FlagSet<Flags> f = [] {
    flags::FlagSet<Flags> s;
    s.String(
         "config", "PATH",
         "the model's config.json (default:\n" RECALL_SHARED_DIR_DEFAULT
         "/tokenizers/smollm2/config.json;\nskipped when the default is missing; an "
         "error when a\ngiven one is)",
         [](auto& o) -> auto& { return o.config; })
        .Choice("shape", "NAME",
                "a built-in shape instead of --config: smollm2-135m, qwen2.5-0.5b,\n"
                "llama-3.2-1b or llama-3-8b",
                [](auto& o) -> auto& { return o.shape; },
                {"smollm2-135m", "qwen2.5-0.5b", "llama-3.2-1b", "llama-3-8b"})
        .Int(
            "threads", "N", "CPU threads of the model (default 0: all cores)",
            [](auto& o) -> auto& { return o.threads; }, 0, 4096)
        .Int(
            "steps", "N",
            "timed decode steps of the weight-type table (default 32; the eviction\n"
            "table always times 64)",
            [](auto& o) -> auto& { return o.steps; }, 1, 1000000)
        .Int(
            "prompt", "N",
            "prompt tokens for prefill, and the eviction table's budget C\n(default 512; at "
            "least 71: batch-8 decode's contexts are prompt\ntokens i..i+63, i < 8)",
            [](auto& o) -> auto& { return o.prompt; }, 71, 1 << 20)
        .String(
            "dtypes", "LIST",
            "weight types, comma-separated: f32, bf16, int8 (bf16 quantized at\n"
            "load), int8-head (int8 with the LM head and embeddings left bf16)\n"
            "(default f32,bf16,int8)",
            [](auto& o) -> auto& { return o.dtypes; })
        .Int(
            "policies", "0|1", "print the eviction policies' decode step table (default 1)",
            [](auto& o) -> auto& { return o.policies; }, 0, 1)
        .Double(
            "budget-gib", "G", "the memory table's budget in GiB (default 4)",
            [](auto& o) -> auto& { return o.budget_gib; }, flags::kAboveZero, 1 << 20)
        .Int(
            "session-tokens", "N",
            "the memory table's session length in tokens (FullKV, bf16 KV)\n(default 4096)",
            [](auto& o) -> auto& { return o.session_tokens; }, 1, 1 << 24)
        .Exclusive("config", "shape")
        .Check([](const Flags& o, const std::set<std::string>&) -> absl::Status {
          for (absl::string_view name : absl::StrSplit(o.dtypes, ',')) {
            if (name != "f32" && name != "bf16" && name != "int8" && name != "int8-head") {
              return absl::InvalidArgumentError(
                  absl::StrCat("--dtypes: \"", name, "\" is not f32, bf16, int8 or int8-head"));
            }
          }
          return absl::OkStatus();
        });
    return s;
  }();
  return f;
}

int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

// The resident bytes a model in `dtype` (int8: bf16 quantized at load) adds to a fresh child
// process, so that no earlier model's freed memory is reused; -1 on failure.
int64_t WeightBytesHeld(const model::ModelConfig& config, kernels::DType dtype, bool int8,
                        const model::Int8Options& int8_options) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    malloc_trim(0);  // the parent's freed heap pages, which the model would reuse unseen
    const int64_t before = ResidentBytes();
    auto m = model::MakeRandomModel(config, dtype, 1);
    if (m.ok() && int8 && !model::QuantizeWeightsInt8(**m, int8_options).ok()) {
      m = absl::InternalError("");
    }
    const int64_t held = m.ok() ? ResidentBytes() - before : -1;
    (void)!write(fds[1], &held, sizeof(held));
    _exit(0);
  }
  close(fds[1]);
  int64_t held = -1;
  if (pid < 0 || read(fds[0], &held, sizeof(held)) != sizeof(held)) held = -1;
  close(fds[0]);
  if (pid > 0) waitpid(pid, nullptr, 0);
  return held;
}

// Bytes a decode step streams from memory: every weight matrix once (the embedding lookup
// reads one row), plus the KV cache of each sequence.
double WeightBytesPerStep(const model::Model& m) {
  double bytes =
      static_cast<double>(m.lm_head.bytes() + m.lm_head.scale_bytes() + m.final_norm.bytes());
  for (const model::LayerWeights& l : m.layers) {
    for (const kernels::Matrix* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down,
                                     &l.attn_norm, &l.ffn_norm, &l.bq, &l.bk, &l.bv}) {
      bytes += static_cast<double>(w->bytes() + w->scale_bytes());
    }
  }
  return bytes;
}

double MatmulFlopsPerToken(const model::Model& m) {
  double flops = 2.0 * static_cast<double>(m.lm_head.numel());
  for (const model::LayerWeights& l : m.layers) {
    for (const kernels::Matrix* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) {
      flops += 2.0 * static_cast<double>(w->numel());
    }
  }
  return flops;
}

struct Result {
  double decode1_tps, decode8_tps, prefill_tps;
  double bytes_per_step, kv_bytes_per_token_b1;
};

Result RunModel(const model::Model& model, kernels::Backend& backend, const Flags& f) {
  const model::ModelConfig& c = model.config;
  const kernels::PagedKvLayout layout{c.n_layers, c.n_kv_heads, c.head_dim, 16};
  const int per_seq_blocks = (f.prompt + f.steps + 15) / 16 + 1;
  auto pool = cache::BlockPool::Create(layout, c.n_layers * (8 * per_seq_blocks + 8));
  if (!pool.ok()) {
    std::fprintf(stderr, "%s\n", std::string(pool.status().message()).c_str());
    std::exit(1);
  }
  runtime::ForwardPass forward(model, backend, {f.prompt});
  std::vector<float> logits(static_cast<size_t>(8) * c.vocab_size);
  std::vector<int32_t> prompt(f.prompt);
  for (int i = 0; i < f.prompt; ++i) prompt[i] = (i * 7919 + 13) % c.vocab_size;
  Result r{};

  // Prefill: one pass of `prompt` tokens (after one warm-up pass).
  {
    cache::SequenceCache warm(pool->get());
    runtime::BatchItem item{&warm, prompt.data(), f.prompt};
    (void)forward.Run({&item, 1}, logits.data());
  }
  cache::SequenceCache seq(pool->get());
  {
    runtime::BatchItem item{&seq, prompt.data(), f.prompt};
    Stopwatch w;
    (void)forward.Run({&item, 1}, logits.data());
    r.prefill_tps = f.prompt / w.ElapsedSeconds();
  }
  // Decode batch 1, continuing the sequence above (context = prompt + steps).
  {
    int32_t tok = 1;
    runtime::BatchItem item{&seq, &tok, 1};
    (void)forward.Run({&item, 1}, logits.data());  // warm-up
    Stopwatch w;
    for (int s = 0; s < f.steps; ++s) {
      tok = (tok * 31 + 7) % c.vocab_size;
      (void)forward.Run({&item, 1}, logits.data());
    }
    r.decode1_tps = f.steps / w.ElapsedSeconds();
    r.kv_bytes_per_token_b1 =
        static_cast<double>(seq.max_length()) * c.n_layers * c.n_kv_heads * 2 * c.head_dim * 4;
  }
  seq.Release();
  // Decode batch 8: 8 sequences with 64-token contexts, one token each per step.
  {
    std::vector<std::unique_ptr<cache::SequenceCache>> seqs;
    std::vector<int32_t> toks(8, 1);
    std::vector<runtime::BatchItem> items;
    for (int i = 0; i < 8; ++i) {
      seqs.push_back(std::make_unique<cache::SequenceCache>(pool->get()));
      runtime::BatchItem p{seqs.back().get(), prompt.data() + i, 64};
      (void)forward.Run({&p, 1}, logits.data());
      items.push_back({seqs.back().get(), &toks[i], 1});
    }
    (void)forward.Run(items, logits.data());  // warm-up
    Stopwatch w;
    for (int s = 0; s < f.steps; ++s) (void)forward.Run(items, logits.data());
    r.decode8_tps = 8.0 * f.steps / w.ElapsedSeconds();
  }
  r.bytes_per_step = WeightBytesPerStep(model);
  return r;
}

constexpr char kUsageHead[] =
    R"U(usage: recall_speed_bench [--config PATH | --shape NAME] [--threads N] [--steps N]
                          [--prompt N] [--dtypes f32,bf16,int8,int8-head] [--policies 0|1]
                          [--budget-gib G] [--session-tokens N]

Speed of the CPU runtime on a random-weight model: decode tokens/s at batch 1 and 8 and
prefill tokens/s per weight type, against baselines measured in the same run (copy bandwidth:
the decode roofline; cblas_sgemm: the prefill target; bf16: int8's speed-ups); the weights'
resident bytes and the sessions that fit beside them; and the decode step time of each
eviction policy against FullKV.

options:
)U";

const std::string kDefaultConfig =
    std::string(RECALL_SHARED_DIR_DEFAULT) + "/tokenizers/smollm2/config.json";

int Main(int argc, char** argv) {
  Flags f;
  if (int rc = ParseBenchFlags(argc, argv, "recall_speed_bench", kUsageHead, SpeedFlags(), &f);
      rc >= 0) {
    return rc;
  }
  absl::StatusOr<model::ModelConfig> config = NamedShape(f.shape);
  if (f.shape.empty()) {
    std::error_code ec;
    if (f.config == kDefaultConfig && !std::filesystem::exists(f.config, ec)) {
      std::printf("SKIP: the SmolLM2 config %s is missing (../shared is not set up)\n",
                  f.config.c_str());
      return 0;
    }
    config = model::ReadHfConfig(f.config);
    if (!config.ok()) {
      std::fprintf(stderr, "--config: %s\n", std::string(config.status().message()).c_str());
      return 2;
    }
  } else if (config->dim == 0) {
    std::fprintf(stderr, "--shape: unknown shape \"%s\"\n", f.shape.c_str());
    return 2;
  }
  config->max_seq_len = std::max(config->max_seq_len, f.prompt + f.steps + 128);
  std::unique_ptr<kernels::Backend> backend = kernels::CreateCpuBackend({f.threads});

  const double bw = MeasureCopyBandwidthGBs();
  const int k = config->dim, n = config->hidden_dim;
  const double sgemm = MeasureSgemmGflops(f.prompt, n, k);
  std::printf("machine: copy bandwidth %.2f GB/s; cblas_sgemm %dx%dx%d %.1f GFLOP/s\n", bw,
              f.prompt, n, k, sgemm);
  std::printf(
      "model: %s shape (dim %d, %d layers, %d/%d heads, vocab %d), random "
      "weights; prompt %d, %d decode steps; int8 GEMV: %s\n\n",
      f.shape.empty() ? "SmolLM2-135M" : f.shape.c_str(), config->dim, config->n_layers,
      config->n_heads, config->n_kv_heads, config->vocab_size, f.prompt, f.steps,
      kernels::cpu::Int8GemvUsesVnni() ? "AVX-512 VNNI" : "plain loops");
  std::printf("%-9s %12s %10s %10s %9s %12s %10s %10s %9s\n", "dtype", "weights_MB", "dec_b1",
              "roofline", "b1/roof", "dec_b8", "prefill", "GFLOP/s", "pf/sgemm");
  Result bf16{};
  struct Held {
    std::string name;
    int64_t bytes;
  };
  std::vector<Held> held;
  for (const std::string& name : std::vector<std::string>(absl::StrSplit(f.dtypes, ','))) {
    // int8-head: int8 with the LM head (and a tied table) left in bf16.
    const bool int8 = name == "int8" || name == "int8-head";
    kernels::DType dtype = kernels::DType::kBF16;
    if (name == "f32") {
      dtype = kernels::DType::kF32;
    } else if (name != "bf16" && !int8) {
      std::fprintf(stderr, "--dtypes: \"%s\" is not f32, bf16, int8 or int8-head\n", name.c_str());
      return 2;
    }
    const model::Int8Options int8_options =
        name == "int8-head" ? model::Int8Options{.lm_head = false, .embeddings = false}
                            : model::Int8Options{};
    auto model = model::MakeRandomModel(*config, dtype, 1);
    if (model.ok() && int8) {
      if (absl::Status q = model::QuantizeWeightsInt8(**model, int8_options); !q.ok()) model = q;
    }
    if (!model.ok()) {
      std::fprintf(stderr, "%s\n", std::string(model.status().message()).c_str());
      return 1;
    }
    const Result r = RunModel(**model, *backend, f);
    if (name == "bf16") bf16 = r;
    held.push_back({name, WeightBytesHeld(*config, dtype, int8, int8_options)});
    // Roofline at batch 1: weights + this sequence's KV cache streamed once per token.
    const double roof = bw * 1e9 / (r.bytes_per_step + r.kv_bytes_per_token_b1);
    const double pf_gflops = r.prefill_tps * MatmulFlopsPerToken(**model) / 1e9;
    std::printf("%-9s %12.1f %10.1f %10.1f %8.0f%% %12.1f %10.1f %10.1f %8.0f%%\n", name.c_str(),
                r.bytes_per_step / 1e6, r.decode1_tps, roof, 100.0 * r.decode1_tps / roof,
                r.decode8_tps, r.prefill_tps, pf_gflops, 100.0 * pf_gflops / sgemm);
    if (int8 && bf16.decode1_tps > 0) {
      std::printf("%s/bf16: decode b1 %.2fx, decode b8 %.2fx, prefill %.2fx\n", name.c_str(),
                  r.decode1_tps / bf16.decode1_tps, r.decode8_tps / bf16.decode8_tps,
                  r.prefill_tps / bf16.prefill_tps);
    }
  }
  std::printf("\n(dec_* and prefill in tokens/s; roofline = bandwidth / bytes read per token; "
              "prefill GFLOP/s counts matmul FLOPs only)\n");

  // Memory: the weights' resident bytes and the sessions that fit beside them.
  kernels::PagedKvLayout kv{config->n_layers, config->n_kv_heads, config->head_dim, 16,
                            kernels::KvDType::kBF16};
  const int64_t session_bytes =
      (f.session_tokens + kv.block_tokens - 1) / kv.block_tokens * kv.BlockBytes() * kv.n_layers;
  const double budget = f.budget_gib * (int64_t{1} << 30);
  std::printf(
      "\nmemory: weights held (resident growth of a process making the model) and "
      "sessions of %d tokens (FullKV, bf16 KV, %.1f MB each) in %.3g GiB:\n",
      f.session_tokens, session_bytes / 1e6, f.budget_gib);
  std::printf("%-9s %15s %10s\n", "dtype", "weights_held_MB", "sessions");
  int64_t bf16_held = 0, bf16_sessions = 0;
  for (const Held& h : held) {
    const int64_t sessions =
        h.bytes < 0
            ? -1
            : std::max<int64_t>(0, static_cast<int64_t>((budget - h.bytes) / session_bytes));
    std::printf("%-9s %15.1f %10lld\n", h.name.c_str(), h.bytes / 1e6,
                static_cast<long long>(sessions));
    if (h.name == "bf16") bf16_held = h.bytes, bf16_sessions = sessions;
    if (h.name == "int8" && bf16_held > 0 && bf16_sessions > 0) {
      std::printf("int8/bf16: weights held %.2fx, sessions %.2fx\n",
                  static_cast<double>(h.bytes) / bf16_held,
                  static_cast<double>(sessions) / bf16_sessions);
    }
  }

  // Eviction bookkeeping: decode-step time per policy vs FullKV at the same length (bf16).
  auto model =
      f.policies
          ? model::MakeRandomModel(*config, kernels::DType::kBF16, 1)
          : absl::StatusOr<std::unique_ptr<model::Model>>(absl::CancelledError("--policies 0"));
  if (model.ok()) {
    PolicyOverheadOptions po;
    po.prompt = f.prompt;
    std::printf("\ndecode step with eviction, bf16, budget C = %d, W = %d, %d steps:\n",
                po.prompt, po.window, po.steps);
    RunPolicyOverhead(**model, *backend, po);
  }
  return 0;
}

}  // namespace
}  // namespace recall::bench

int main(int argc, char** argv) { return recall::bench::Main(argc, argv); }
