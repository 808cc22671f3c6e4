// What the KV cache's stored type buys (issue 26), every ratio against fp32 measured in the
// same run:
//
// 1. Capacity: sessions of --session-tokens tokens that fit one pool of --pool-bytes in the
//    KV shape of Qwen2.5-0.5B (24 layers, 2 KV heads, head_dim 64), FullKV and lazy at a
//    30% budget. Each (type, policy) runs one real session to that length through the
//    offline generator (random weights; a model with that KV shape and a small MLP and vocab,
//    since the bytes a session holds depend only on the KV shape), takes the peak KV bytes it
//    held, then fills a real pool of that type with caches of that peak until the pool is
//    full: the count is the capacity.
// 2. CPU speed: one decode step of Qwen2.5-0.5B (random bf16 weights) with --batch sequences
//    of --context cached tokens each: the attention alone (every layer's DecodeAttention
//    over every sequence) and the whole step (ForwardPass::Run), per KV type.
//
// usage: recall_kv_dtype_bench [--threads N] [--pool-bytes B] [--session-tokens N]
//                              [--context N] [--batch N] [--steps N] [--skip-speed]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "bench/shapes.h"
#include "cache/block_pool.h"
#include "cache/sequence_cache.h"
#include "common/clock.h"
#include "common/flags.h"
#include "common/status.h"
#include "kernels/backend.h"
#include "kernels/kv_rows.h"
#include "worker/model/random_model.h"
#include "worker/offline/generator.h"
#include "worker/runtime/engine.h"
#include "worker/serving/cache_factory.h"
#include "worker/tokenizer/tokenizer.h"

namespace recall::bench {
namespace {

struct Flags {
  int threads = 0;
  int64_t pool_bytes = int64_t{256} << 20;
  int session_tokens = 2048;
  int context = 4096;
  int batch = 8;
  int steps = 5;
  bool speed = true;
};

// Each capacity session is a 64-token prompt and then at least one generated token.
constexpr int kCapacityPrompt = 64;

const flags::FlagSet<Flags>& KvDtypeFlags() {
  static const flags::FlagSet<Flags> f = [] {
    flags::FlagSet<Flags> s;
    s.Int(
         "threads", "N", "CPU threads (default 0: all cores)",
         [](auto& o) -> auto& { return o.threads; }, 0, 4096)
        .Bytes(
            "pool-bytes", "B",
            "the capacity pool's size: bytes, or a number with K/M/G (binary),\n"
            "KB/MB/GB (decimal) (default 256M = 268435456)",
            [](auto& o) -> auto& { return o.pool_bytes; }, 1)
        .Int(
            "session-tokens", "N",
            "tokens of each capacity session (default 2048; at least 65: a\n64-token prompt "
            "and one generated token)",
            [](auto& o) -> auto& { return o.session_tokens; }, kCapacityPrompt + 1, 1 << 24)
        .Int(
            "context", "N", "cached tokens per sequence in the speed part (default 4096)",
            [](auto& o) -> auto& { return o.context; }, 1, 1 << 24)
        .Int(
            "batch", "N", "sequences per decode step in the speed part (default 8)",
            [](auto& o) -> auto& { return o.batch; }, 1, 4096)
        .Int(
            "steps", "N", "timed decode steps per type, the best kept (default 5)",
            [](auto& o) -> auto& { return o.steps; }, 1, 1000000)
        .Switch(
            "skip-speed", "run the capacity part only", [](auto& o) -> auto& { return o.speed; },
            false);
    return s;
  }();
  return f;
}

const kernels::KvDType kTypes[] = {kernels::KvDType::kF32, kernels::KvDType::kBF16,
                                   kernels::KvDType::kF16, kernels::KvDType::kInt8};

// ---- 1. capacity

// Qwen2.5-0.5B's KV shape (24 layers, 2 KV heads, head_dim 64) with 2 query heads, a
// 128-wide residual, a 256-wide MLP and stories260K's 512-token vocabulary.
model::ModelConfig KvShapeConfig(int context) {
  model::ModelConfig c = NamedShape("qwen2.5-0.5b");
  c.n_heads = c.n_kv_heads;
  c.dim = c.n_heads * c.head_dim;
  c.hidden_dim = 256;
  c.vocab_size = 512;
  c.tied_embeddings = true;
  c.max_seq_len = context;
  return c;
}

struct Capacity {
  int64_t peak_bytes = 0;  // one session's peak
  int64_t block_bytes = 0;
  int64_t pool_blocks = 0;
  int sessions = 0;
};

absl::StatusOr<Capacity> MeasureCapacity(const model::Model& model, const model::Tokenizer& tok,
                                         kernels::KvDType t, const std::string& policy,
                                         const Flags& f) {
  const model::ModelConfig& c = model.config;
  runtime::EngineOptions eo;
  eo.threads = f.threads;
  eo.kv_dtype = t;
  eo.kv_cache_bytes = f.pool_bytes;
  RECALL_ASSIGN_OR_RETURN(std::unique_ptr<runtime::Engine> engine,
                          runtime::Engine::Create(model, eo));
  serving::CacheDefaults d;
  d.policy = policy;
  if (policy != "full") d.budget_fraction = 0.3;
  RECALL_ASSIGN_OR_RETURN(serving::CacheFactory factory,
                          serving::CacheFactory::Create(d, c, c.n_kv_heads, 1, t));
  RECALL_ASSIGN_OR_RETURN(serving::SessionCacheSpec spec, factory.Resolve({}, 0));
  std::vector<int32_t> prompt(kCapacityPrompt);
  for (int i = 0; i < kCapacityPrompt; ++i) prompt[i] = 3 + (i * 37) % (c.vocab_size - 3);
  offline::GenerateOptions o;
  o.max_tokens = f.session_tokens - static_cast<int>(prompt.size());
  o.sampling.temperature = 1.0f;
  o.sampling.seed = 5;
  o.eviction = spec.evictor;
  o.prefill_chunk = 64;
  RECALL_ASSIGN_OR_RETURN(offline::GenerateResult r,
                          offline::Generate(engine->forward(0), engine->pool(0), tok, prompt, o));
  if (static_cast<int>(r.tokens.size()) != o.max_tokens) {
    return absl::InternalError("the session stopped before its length");
  }
  Capacity cap;
  cache::BlockPool& pool = engine->pool(0);
  cap.peak_bytes = r.peak_kv_bytes;
  cap.block_bytes = pool.block_bytes();
  cap.pool_blocks = pool.num_blocks();
  // Fill the pool with caches holding that peak: the peak's blocks per layer, in tokens.
  const int64_t peak_blocks_per_layer =
      (r.peak_kv_bytes / pool.block_bytes() + c.n_layers - 1) / c.n_layers;
  const int tokens = static_cast<int>(peak_blocks_per_layer) * pool.layout().block_tokens;
  std::vector<std::unique_ptr<cache::SequenceCache>> held;
  while (true) {
    auto seq = std::make_unique<cache::SequenceCache>(&pool);
    if (!seq->Reserve(tokens).ok()) break;
    held.push_back(std::move(seq));
  }
  cap.sessions = static_cast<int>(held.size());
  return cap;
}

int RunCapacity(const Flags& f) {
  const std::string tok_path =
      std::string(RECALL_SHARED_DIR_DEFAULT) + "/models/stories260K/tok512.bin";
  auto tok = model::LoadTokenizer(tok_path, 512);
  if (!tok.ok()) {
    std::printf("SKIP capacity: no tokenizer (%s)\n", std::string(tok.status().message()).c_str());
    return 0;
  }
  const model::ModelConfig config = KvShapeConfig(f.session_tokens + 64);
  auto model = model::MakeRandomModel(config, kernels::DType::kF32, 1);
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", std::string(model.status().message()).c_str());
    return 1;
  }
  std::printf(
      "1. capacity: sessions of %d tokens in one %lld MiB pool, Qwen2.5-0.5B's KV shape "
      "(%d layers, %d KV heads, head_dim %d); lazy at a 30%% budget\n\n",
      f.session_tokens, static_cast<long long>(f.pool_bytes >> 20), config.n_layers,
      config.n_kv_heads, config.head_dim);
  std::printf("%-6s %-5s %11s %12s %11s %9s %9s\n", "policy", "type", "block_bytes", "pool_blocks",
              "peak_bytes", "sessions", "vs_f32");
  for (const char* policy : {"full", "lazy"}) {
    int f32_sessions = 0;
    for (const kernels::KvDType t : kTypes) {
      auto cap = MeasureCapacity(**model, **tok, t, policy, f);
      if (!cap.ok()) {
        std::fprintf(stderr, "%s %s: %s\n", policy, kernels::KvDTypeName(t),
                     std::string(cap.status().message()).c_str());
        return 1;
      }
      if (t == kernels::KvDType::kF32) f32_sessions = cap->sessions;
      std::printf("%-6s %-5s %11lld %12lld %11lld %9d %8.2fx\n", policy, kernels::KvDTypeName(t),
                  static_cast<long long>(cap->block_bytes),
                  static_cast<long long>(cap->pool_blocks), static_cast<long long>(cap->peak_bytes),
                  cap->sessions, static_cast<double>(cap->sessions) / std::max(f32_sessions, 1));
    }
  }
  std::printf("\n");
  return 0;
}

// ---- 2. CPU decode speed

// --batch caches of --context tokens of random K/V rows (written as StoreKv writes them) in a
// pool of one type, with the closures that time one attention pass and one decode step.
class SpeedCase {
 public:
  SpeedCase(const model::Model& model, kernels::Backend& backend, kernels::KvDType t,
            const Flags& f)
      : model_(model), backend_(backend), forward_(model, backend, {std::max(64, f.batch)}) {
    const model::ModelConfig& c = model.config;
    const kernels::PagedKvLayout layout{c.n_layers, c.n_kv_heads, c.head_dim, 16, t};
    const int64_t per_seq = (f.context + 32) / 16 + 1;
    auto pool = cache::BlockPool::Create(layout, c.n_layers * f.batch * per_seq);
    if (!pool.ok()) {
      std::fprintf(stderr, "%s\n", std::string(pool.status().message()).c_str());
      std::exit(1);
    }
    pool_ = std::move(*pool);
    std::mt19937 rng(3);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const int kv_dim = c.n_kv_heads * c.head_dim;
    std::vector<float> k(static_cast<size_t>(256) * kv_dim), v(k.size());
    std::vector<int32_t> pos(256);
    for (int i = 0; i < f.batch; ++i) {
      seqs_.push_back(std::make_unique<cache::SequenceCache>(pool_.get()));
      cache::SequenceCache& s = *seqs_.back();
      if (!s.Reserve(f.context).ok()) std::exit(1);
      for (int at = 0; at < f.context; at += 256) {
        const int n = std::min(256, f.context - at);
        std::vector<int32_t> start(c.n_kv_heads, at);
        for (int l = 0; l < c.n_layers; ++l) {
          for (float& x : k) x = normal(rng);
          for (float& x : v) x = normal(rng);
          backend.StoreKv(s.View(), l, k.data(), v.data(), n, start.data());
        }
        for (int j = 0; j < n; ++j) pos[j] = at + j;
        s.CommitAppend(pos.data(), n);
      }
    }
    q_.resize(static_cast<size_t>(c.n_heads) * c.head_dim);
    for (float& x : q_) x = normal(rng);
    out_.resize(q_.size());
    lens_.assign(c.n_kv_heads, f.context);
    logits_.resize(static_cast<size_t>(f.batch) * c.vocab_size);
    toks_.assign(f.batch, 7);
  }

  // Seconds of what a decode step's attention reads: every layer of every sequence.
  double Attention() {
    const model::ModelConfig& c = model_.config;
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    Stopwatch w;
    for (int l = 0; l < c.n_layers; ++l) {
      for (auto& s : seqs_) {
        backend_.DecodeAttention(s->View(), l, lens_.data(), q_.data(), c.n_heads, scale,
                                 out_.data(), nullptr, 0);
      }
    }
    return w.ElapsedSeconds();
  }
  // Seconds of one decode step (one new token per sequence, which then stays cached).
  double Step() {
    std::vector<runtime::BatchItem> items;
    for (size_t i = 0; i < seqs_.size(); ++i) items.push_back({seqs_[i].get(), &toks_[i], 1});
    Stopwatch w;
    (void)forward_.Run(items, logits_.data());
    return w.ElapsedSeconds();
  }

 private:
  const model::Model& model_;
  kernels::Backend& backend_;
  runtime::ForwardPass forward_;
  std::unique_ptr<cache::BlockPool> pool_;
  std::vector<std::unique_ptr<cache::SequenceCache>> seqs_;
  std::vector<float> q_, out_, logits_;
  std::vector<int32_t> lens_, toks_;
};

int RunSpeed(const Flags& f) {
  model::ModelConfig config = NamedShape("qwen2.5-0.5b");
  config.max_seq_len = f.context + 64;
  auto model = model::MakeRandomModel(config, kernels::DType::kBF16, 1);
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", std::string(model.status().message()).c_str());
    return 1;
  }
  std::unique_ptr<kernels::Backend> backend = kernels::CreateCpuBackend({f.threads});
  std::vector<std::unique_ptr<SpeedCase>> cases;
  for (const kernels::KvDType t : kTypes) {
    cases.push_back(std::make_unique<SpeedCase>(**model, *backend, t, f));
  }
  // Rounds over the types in turn, the best time of each kept: a slow spell of the machine
  // touches every type alike instead of one.
  const int n = static_cast<int>(cases.size());
  std::vector<double> attention(n, 1e30), step(n, 1e30);
  for (auto& c : cases) (void)c->Attention();  // warm-up
  for (int round = 0; round < 10; ++round) {
    for (int i = 0; i < n; ++i) attention[i] = std::min(attention[i], cases[i]->Attention());
  }
  for (auto& c : cases) (void)c->Step();  // warm-up
  for (int round = 0; round < f.steps; ++round) {
    for (int i = 0; i < n; ++i) step[i] = std::min(step[i], cases[i]->Step());
  }
  std::printf(
      "2. CPU decode step: Qwen2.5-0.5B shape, random bf16 weights, batch %d, %d cached "
      "tokens per sequence; best of 10 attention passes and of %d steps, the types "
      "taking turns\n\n",
      f.batch, f.context, f.steps);
  std::printf("%-5s %14s %9s %10s %9s\n", "type", "attention_ms", "vs_f32", "step_ms", "vs_f32");
  for (int i = 0; i < n; ++i) {
    std::printf("%-5s %14.2f %8.2fx %10.1f %8.2fx\n", kernels::KvDTypeName(kTypes[i]),
                attention[i] * 1e3, attention[0] / attention[i], step[i] * 1e3, step[0] / step[i]);
  }
  std::printf("\n(vs_f32: fp32's time over this type's, > 1 is faster)\n");
  return 0;
}

constexpr char kUsageHead[] =
    R"U(usage: recall_kv_dtype_bench [--threads N] [--pool-bytes B] [--session-tokens N]
                             [--context N] [--batch N] [--steps N] [--skip-speed]

What the KV cache's stored type buys (f32, bf16, f16, int8), every ratio against f32 in the
same run:
1. capacity: sessions of --session-tokens tokens that fit one pool of --pool-bytes in
   Qwen2.5-0.5B's KV shape (random weights), FullKV and lazy at a 30% budget (needs the
   stories260K tokenizer in
   )U" RECALL_SHARED_DIR_DEFAULT
    R"U(/models/stories260K; skipped without it);
2. CPU speed: one decode step of Qwen2.5-0.5B's shape (random bf16 weights) with --batch
   sequences of --context cached tokens: the attention alone and the whole step, per type.

options:
)U";

int Main(int argc, char** argv) {
  Flags f;
  if (int rc = ParseBenchFlags(argc, argv, "recall_kv_dtype_bench", kUsageHead, KvDtypeFlags(), &f);
      rc >= 0) {
    return rc;
  }
  if (int rc = RunCapacity(f); rc != 0) return rc;
  return f.speed ? RunSpeed(f) : 0;
}

}  // namespace
}  // namespace recall::bench

int main(int argc, char** argv) { return recall::bench::Main(argc, argv); }
