// GPU decode benchmark of the CUDA backend (issue 7). Random weights with the shapes of
// SmolLM2-135M, Qwen2.5-0.5B and Llama-3-8B (bf16; with --weight-dtype int8 or fp8 the layers'
// linear weights in that type with their scales, the embeddings and LM head bf16), paged KV of
// --kv-dtype (f32 by default, as the committed results; bf16, f16, int8). Prints, per (shape,
// batch, context): decode tokens/s and the fraction of the HBM roofline, where the roofline step
// time is (weight bytes + KV bytes read and written per step) / the device-to-device copy bandwidth
// measured in the same run. Also: LazyEviction's cost per decode step against a FullKV step at
// the same cache length, and how many 8K-token sessions fit in the GPU's memory with FullKV
// and with lazy at a 30% budget (by reserving blocks in one pool until it is full).
// The KV caches are filled with random rows without a prefill (decode time does not depend on
// their values). Each step picks the greedy tokens on the device and copies their ids back
// (BatchItem::pick), as transformers' greedy loop does. Writes JSON for
// bench/gpu/report.py, which sets it beside transformers.
//
//   recall_gpu_decode_bench [--shapes smollm2-135m,qwen2.5-0.5b,llama-3-8b] [--batches 1,16,64]
//       [--contexts 1024,8192] [--steps 32] [--out-json FILE] [--time-ops 1]
//       [--temperature T] [--top-k K] [--top-p P] [--kv-dtype f32|bf16|f16|int8]
//       [--weight-dtype bf16|int8|fp8] [--chunks-in-flight 0|1|2|4]
// --temperature > 0 samples on the device instead (Backend::SampleRows, with --top-k and
// --top-p), to see what sampling adds to a step against a greedy run.
// --time-ops 1 prints each configuration's GPU time per op (CudaOpTimes; the events add a
// little time to every op, so take the tokens/s of a run without it).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench/bench_util.h"
#include "bench/shapes.h"
#include "cache/block_pool.h"
#include "cache/sequence_cache.h"
#include "kernels/cuda_backend.h"
#include "worker/model/half.h"
#include "worker/model/model.h"
#include "worker/offline/sequence.h"
#include "worker/runtime/forward.h"

namespace recall {
namespace {

using Clock = std::chrono::steady_clock;

struct Shape {
  std::string name;
  model::ModelConfig c;
};

Shape MakeShape(const std::string& name) { return {name, bench::NamedShape(name)}; }

#define CHECK_OK(expr)                                                         \
  do {                                                                         \
    const absl::Status st_ = (expr);                                           \
    if (!st_.ok()) {                                                           \
      std::fprintf(stderr, "FATAL %s: %s\n", #expr, st_.ToString().c_str());   \
      std::exit(1);                                                            \
    }                                                                          \
  } while (0)

// The KV storage type of every pool (--kv-dtype).
kernels::KvDType g_kv_dtype = kernels::KvDType::kF32;
// The type of the layers' linear weights (--weight-dtype): bf16, int8 or fp8.
kernels::DType g_weight_dtype = kernels::DType::kBF16;

// Device memory filled by tiling one random host chunk (uniform in +-scale, rounded to bf16 or
// kept f32; int8 and fp8: random bytes, no NaN code).

class Filler {
 public:
  explicit Filler(kernels::Memory& m) : memory_(m) {}
  void* Fill(size_t elements, kernels::DType dt, float scale, std::vector<kernels::Buffer>& keep) {
    const size_t bytes = elements * kernels::DTypeSize(dt);
    auto buf = kernels::Buffer::Allocate(memory_, bytes);
    CHECK_OK(buf.status());
    const std::vector<char>& chunk = Chunk(dt, scale);
    size_t done = std::min(bytes, chunk.size());
    memory_.CopyIn(buf->get(), chunk.data(), done);
    while (done < bytes) {  // double what is filled
      const size_t n = std::min(done, bytes - done);
      memory_.Copy(static_cast<char*>(buf->get()) + done, buf->get(), n);
      done += n;
    }
    void* p = buf->get();
    keep.push_back(std::move(*buf));
    return p;
  }

 private:
  const std::vector<char>& Chunk(kernels::DType dt, float scale) {
    const auto key = std::make_pair(static_cast<int>(dt), scale);
    auto it = chunks_.find(key);
    if (it != chunks_.end()) return it->second;
    const size_t n = size_t{1} << 22;  // 4M elements, then tiled
    std::mt19937 rng(static_cast<uint32_t>(scale * 1e6f) + static_cast<uint32_t>(dt));
    std::uniform_real_distribution<float> d(-scale, scale);
    std::vector<char> bytes(n * kernels::DTypeSize(dt));
    for (size_t i = 0; i < n; ++i) {
      const float v = d(rng);
      if (kernels::DTypeSize(dt) == 1) {
        const uint8_t code = static_cast<uint8_t>(rng());
        bytes[i] = static_cast<char>((code & 0x7F) == 0x7F ? 0x38 : code);
      } else if (dt == kernels::DType::kF32) {
        reinterpret_cast<float*>(bytes.data())[i] = v;
      } else {
        reinterpret_cast<uint16_t*>(bytes.data())[i] = model::F32ToBf16(v);
      }
    }
    return chunks_.emplace(key, std::move(bytes)).first->second;
  }
  kernels::Memory& memory_;
  std::map<std::pair<int, float>, std::vector<char>> chunks_;
};

struct DeviceModel {
  model::Model m;
  std::vector<kernels::Buffer> buffers;
  int64_t weight_bytes = 0;  // bytes one decode step reads (matrices; embeddings: the LM head)
};

void MakeDeviceModel(const model::ModelConfig& c, kernels::Memory& memory, DeviceModel& out) {
  Filler fill(memory);
  out.m.config = c;
  const auto mat = [&](int64_t rows, int64_t cols) {
    kernels::Matrix x{fill.Fill(rows * cols, kernels::DType::kBF16, 1.0f / std::sqrt(float(cols)),
                                out.buffers),
                      kernels::DType::kBF16, rows, cols};
    out.weight_bytes += static_cast<int64_t>(x.bytes());
    return x;
  };
  const auto vec = [&](int64_t n, float scale) {
    return kernels::Matrix{fill.Fill(n, kernels::DType::kF32, scale, out.buffers),
                           kernels::DType::kF32, 1, n};
  };
  // A layer's linear weight in --weight-dtype: the bytes, then the scales the kernel reads
  // (int8: one per row; fp8: one per row and block of 128 columns), counted in the bytes read.
  const auto linear = [&](int64_t rows, int64_t cols) {
    if (g_weight_dtype == kernels::DType::kBF16) return mat(rows, cols);
    kernels::Matrix x{fill.Fill(rows * cols, g_weight_dtype, 1.0f, out.buffers), g_weight_dtype,
                      rows, cols};
    if (g_weight_dtype == kernels::DType::kF8E4M3) x.scale_block = 128;
    const int64_t scales = g_weight_dtype == kernels::DType::kI8 ? rows : rows * x.ScaleColumns();
    x.scales = static_cast<const float*>(
        fill.Fill(scales, kernels::DType::kF32, 1.0f / (64 * std::sqrt(float(cols))), out.buffers));
    out.weight_bytes += static_cast<int64_t>(x.bytes()) + scales * 4;
    return x;
  };
  const int q = c.n_heads * c.head_dim, kv = c.n_kv_heads * c.head_dim;
  out.m.tok_embeddings = mat(c.vocab_size, c.dim);
  out.m.lm_head = c.tied_embeddings ? out.m.tok_embeddings : mat(c.vocab_size, c.dim);
  if (!c.tied_embeddings) out.weight_bytes -= static_cast<int64_t>(out.m.tok_embeddings.bytes());
  out.m.final_norm = vec(c.dim, 1.0f);
  out.m.layers.resize(c.n_layers);
  for (model::LayerWeights& w : out.m.layers) {
    w.attn_norm = vec(c.dim, 1.0f);
    w.ffn_norm = vec(c.dim, 1.0f);
    w.wq = linear(q, c.dim), w.wk = linear(kv, c.dim), w.wv = linear(kv, c.dim);
    w.wo = linear(c.dim, q);
    w.w_gate = linear(c.hidden_dim, c.dim), w.w_up = linear(c.hidden_dim, c.dim);
    w.w_down = linear(c.dim, c.hidden_dim);
    if (c.qkv_bias) w.bq = vec(q, 0.02f), w.bk = vec(kv, 0.02f), w.bv = vec(kv, 0.02f);
  }
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Device-to-device copy bandwidth (bytes read + written per second) of a 4 GiB copy.
double CopyBandwidth(kernels::Memory& memory) {
  const size_t bytes = size_t{2} << 30;
  std::vector<kernels::Buffer> keep;
  Filler fill(memory);
  void* a = fill.Fill(bytes / 4, kernels::DType::kF32, 1.0f, keep);
  void* b = fill.Fill(bytes / 4, kernels::DType::kF32, 1.0f, keep);
  std::vector<double> t;
  float sink;
  for (int i = 0; i < 12; ++i) {
    const auto t0 = Clock::now();
    memory.Copy(i % 2 ? a : b, i % 2 ? b : a, bytes);
    memory.CopyOut(&sink, a, sizeof(sink));  // waits for the copy
    if (i >= 2) t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return 2.0 * bytes / Median(t);
}

struct Result {
  std::string shape;
  int batch = 0, context = 0;
  std::string status = "ok";
  double step_ms = 0, tokens_per_s = 0, roofline_ms = 0, roofline_fraction = 0;
  int64_t graph_replays = 0;  // steps replayed from CUDA graphs (--graphs 1)
};

// Decode steps of `batch` sequences whose caches hold `context` random rows.
Result RunDecode(const Shape& s, DeviceModel& dm, kernels::Backend& gpu,
                 const kernels::SamplingParams& sampling, int batch, int context, int steps,
                 double bw, bool graphs) {
  Result r{s.name, batch, context};
  const model::ModelConfig& c = s.c;
  const int bt = 16;
  kernels::PagedKvLayout layout{c.n_layers, c.n_kv_heads, c.head_dim, bt, g_kv_dtype};
  const int64_t per_seq_blocks =
      static_cast<int64_t>(c.n_layers) * ((context + steps + 8 + bt - 1) / bt);
  const int64_t pool_bytes = per_seq_blocks * batch * layout.BlockBytes();
  size_t free_b = 0, total_b = 0;
  cudaMemGetInfo(&free_b, &total_b);
  if (static_cast<double>(pool_bytes) > 0.92 * static_cast<double>(free_b)) {
    r.status = std::string("does not fit (") + kernels::KvDTypeName(g_kv_dtype) + " KV)";
    return r;
  }
  auto pool = cache::BlockPool::Create(layout, per_seq_blocks * batch, gpu.memory());
  if (!pool.ok()) {
    r.status = "pool: " + std::string(pool.status().message());
    return r;
  }
  {  // random KV rows
    std::vector<kernels::Buffer> keep;
    Filler fill(gpu.memory());
    // Random values of the stored type: int8 planes get bf16 values, so every row byte is
    // some int8 and every scale a float near a unit normal (its upper half a bf16 value).
    const kernels::DType fill_type = g_kv_dtype == kernels::KvDType::kF32   ? kernels::DType::kF32
                                     : g_kv_dtype == kernels::KvDType::kF16 ? kernels::DType::kF16
                                                                            : kernels::DType::kBF16;
    const size_t elem = kernels::DTypeSize(fill_type);
    const size_t bytes = static_cast<size_t>(per_seq_blocks * batch * layout.BlockBytes());
    const size_t chunk = size_t{1} << 30;
    void* src = fill.Fill(std::min(bytes, chunk) / elem, fill_type, 1.0f, keep);
    for (size_t done = 0; done < bytes;) {
      const size_t n = std::min(bytes - done, chunk);
      gpu.memory().Copy((*pool)->base() + done, src, n);
      done += n;
    }
  }
  std::vector<std::unique_ptr<cache::SequenceCache>> caches;
  std::vector<int32_t> positions(context);
  for (int i = 0; i < context; ++i) positions[i] = i;
  for (int b = 0; b < batch; ++b) {
    caches.push_back(std::make_unique<cache::SequenceCache>(pool->get()));
    CHECK_OK(caches.back()->Reserve(context));
    caches.back()->CommitAppend(positions.data(), context);
  }
  runtime::ForwardPass forward(
      dm.m, gpu,
      runtime::ForwardOptions{.max_batch_tokens = std::max(batch, 64), .step_graphs = graphs});
  std::vector<int32_t> tokens(batch);
  std::vector<runtime::BatchItem> items(batch);
  std::vector<float> logits(static_cast<size_t>(batch) * c.vocab_size);
  // Picked on the device: greedy, as transformers' loop does, or with --temperature/--top-p.
  std::vector<int32_t> picked(batch);
  std::vector<double> times;
  const int warmup = 3;
  for (int step = 0; step < warmup + steps; ++step) {
    for (int b = 0; b < batch; ++b) {
      tokens[b] = (step * 7919 + b * 104729) % c.vocab_size;
      items[b].cache = caches[b].get();
      items[b].tokens = &tokens[b];
      items[b].n = 1;
      items[b].pick = &picked[b];
      items[b].sampling = &sampling;
      items[b].draw = static_cast<float>((step * 31 + b * 17) % 97) / 97.0f;
    }
    const auto t0 = Clock::now();
    absl::Status st = forward.Run(items, logits.data());  // copies the token ids back: synchronous
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    if (!st.ok()) {
      r.status = "forward: " + std::string(st.message());
      return r;
    }
    if (step >= warmup) times.push_back(dt);
    if (step + 1 == warmup) kernels::CudaOpTimes(gpu, /*reset=*/true);  // time the measured steps
  }
  const std::string op_times = kernels::CudaOpTimes(gpu, /*reset=*/true);
  if (!op_times.empty()) {
    std::printf("GPU time per op, %s batch %d ctx %d, over %d steps (wall %.3f ms/step median):\n%s",
                s.name.c_str(), batch, context, steps, Median(times) * 1e3, op_times.c_str());
  }
  r.graph_replays = forward.step_graphs().replays();
  r.step_ms = Median(times) * 1e3;
  r.tokens_per_s = batch / Median(times);
  // Roofline: weights once, every sequence's KV read (at the median step's length) and its new
  // row written, in the stored type (int8 scales included).
  const double kv_row = static_cast<double>(layout.TokenBytes());
  const double bytes = dm.weight_bytes + batch * (context + warmup + steps / 2.0 + 1) * kv_row;
  r.roofline_ms = bytes / bw * 1e3;
  r.roofline_fraction = r.roofline_ms / r.step_ms;
  return r;
}

// Lazy's cost per decode step: one sequence decoding with lazy (the evictor steps on the
// device: one fused LazyObserve per step, one LazyEvict every W steps that selects and
// compacts there, only the keep lists copied back) against FullKV, both holding about
// `held` tokens.
struct LazyCost {
  double full_ms = 0, lazy_ms = 0;
  int held = 0;
};

LazyCost MeasureLazy(const Shape& s, DeviceModel& dm, kernels::Backend& gpu, int context,
                     double budget_fraction, int steps, bool graphs) {
  LazyCost out;
  const model::ModelConfig& c = s.c;
  kernels::PagedKvLayout layout{c.n_layers, c.n_kv_heads, c.head_dim, 16, g_kv_dtype};
  auto pool = cache::BlockPool::Create(layout, 2 * c.n_layers * ((context + steps + 64) / 16 + 2),
                                       gpu.memory());
  CHECK_OK(pool.status());
  runtime::ForwardPass forward(
      dm.m, gpu, runtime::ForwardOptions{.max_batch_tokens = 512, .step_graphs = graphs});
  const int budget = static_cast<int>(context * budget_fraction);
  out.held = budget;
  std::vector<float> logits(c.vocab_size);
  const auto run = [&](bool lazy) {
    std::optional<cache::eviction::SessionEvictorOptions> o;
    if (lazy) {
      o.emplace();
      o->policy.name = "lazy";
      o->budget.budget = budget;
    }
    auto seq = offline::LocalSequence::Create(forward, **pool, o);
    CHECK_OK(seq.status());
    // Lazy prefills the whole context and evicts to its budget; FullKV prefills `budget`.
    std::vector<int32_t> prompt(lazy ? context : budget);
    for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = (i * 31 + 7) % c.vocab_size;
    CHECK_OK((*seq)->Prefill(prompt, 512, logits.data()));
    std::vector<double> t;
    for (int i = 0; i < steps + 8; ++i) {
      if (i == 8) kernels::CudaOpTimes(gpu, /*reset=*/true);  // time the measured steps
      const auto t0 = Clock::now();
      CHECK_OK((*seq)->Decode((i * 13 + 1) % c.vocab_size, logits.data()));
      if (i >= 8) t.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
    // With --time-ops 1: where each step's time goes, FullKV and lazy side by side.
    const std::string op_times = kernels::CudaOpTimes(gpu, /*reset=*/true);
    if (!op_times.empty()) {
      std::printf("GPU time per op, %s %s ctx %d, over %d steps (wall %.3f ms/step median):\n%s",
                  s.name.c_str(), lazy ? "lazy 30%" : "FullKV", context, steps, Median(t) * 1e3,
                  op_times.c_str());
    }
    return Median(t) * 1e3;
  };
  out.full_ms = run(false);
  out.lazy_ms = run(true);
  return out;
}

// Sessions of `tokens` held tokens that fit in one pool of all free memory.
int64_t SessionsThatFit(const model::ModelConfig& c, kernels::Backend& gpu, int tokens) {
  kernels::PagedKvLayout layout{c.n_layers, c.n_kv_heads, c.head_dim, 16, g_kv_dtype};
  size_t free_b = 0, total_b = 0;
  cudaMemGetInfo(&free_b, &total_b);
  const int64_t block_bytes = layout.BlockBytes();
  auto pool = cache::BlockPool::Create(layout, static_cast<int64_t>(free_b * 0.95) / block_bytes,
                                       gpu.memory());
  if (!pool.ok()) return -1;
  std::vector<std::unique_ptr<cache::SequenceCache>> seqs;
  while (true) {
    auto seq = std::make_unique<cache::SequenceCache>(pool->get());
    if (!seq->Reserve(tokens).ok()) break;
    seqs.push_back(std::move(seq));
  }
  return static_cast<int64_t>(seqs.size());
}

std::vector<int> Ints(const std::string& s) {
  std::vector<int> out;
  for (absl::string_view p : absl::StrSplit(s, ',')) {
    int v;
    if (absl::SimpleAtoi(p, &v)) out.push_back(v);
  }
  return out;
}

constexpr char kUsage[] =
    R"U(usage: recall_gpu_decode_bench [--shapes LIST] [--batches LIST] [--contexts LIST]
                               [--steps N] [--out-json FILE] [--time-ops 0|1] [--graphs 0|1]
                               [--temperature T] [--top-k K] [--top-p P]
                               [--kv-dtype f32|bf16|f16|int8] [--weight-dtype bf16|int8|fp8]
                               [--chunks-in-flight 0|1|2|4]

Decode speed of the CUDA backend against the HBM roofline, random weights, paged KV of random
rows (no prefill). Per (shape, batch, context): decode tokens/s and the fraction of the
roofline ((weight + KV bytes per step) / the device-to-device copy bandwidth measured in the
same run). For every shape but qwen2.5-0.5b also lazy's cost per decode step against FullKV
(context 1024, 30% budget) and the 8K-token sessions that fit in the GPU's memory with FullKV
and with lazy at 30%. Skipped without a CUDA device.

options:
  --shapes LIST           smollm2-135m, qwen2.5-0.5b, llama-3.2-1b, llama-3-8b, comma-separated
                          (default smollm2-135m,qwen2.5-0.5b,llama-3-8b)
  --batches LIST          batch sizes (default 1,16,64)
  --contexts LIST         cached tokens per sequence (default 1024,8192)
  --steps N               timed decode steps per configuration and per lazy cost (default 32)
  --out-json FILE         write the results as JSON for bench/gpu/report.py (default: none)
  --time-ops 0|1          1: print each configuration's GPU time per op (the events slow every
                          op a little) (default 0)
  --graphs 0|1            1: replay one CUDA graph per batch shape; 0: launch every op
                          (default 1)
  --temperature T         0: greedy picks on the device (default); > 0 samples on the device
  --top-k K               with --temperature > 0: keep the K most likely tokens (default 0: off)
  --top-p P               with --temperature > 0: nucleus mass in (0, 1] (default 1: off)
  --kv-dtype TYPE         the KV cache's type: f32 (default), bf16, f16 or int8
  --weight-dtype TYPE     the layers' linear weights: bf16 (default), int8 or fp8 (with their
                          scales; embeddings and LM head bf16)
  --chunks-in-flight N    chunks of 8 weights each lane of the few-rows matmul loads before its
                          FMAs: 1, 2 or 4, or 0 for the weights' type's default (default 0)
  -h, --help              print this and exit
)U";

int Main(int argc, char** argv) {
  if (bench::PrintHelpIfAsked(argc, argv, kUsage)) return 0;
  std::string shapes = "smollm2-135m,qwen2.5-0.5b,llama-3-8b", out_json;
  std::vector<int> batches = {1, 16, 64}, contexts = {1024, 8192};
  int steps = 32;
  bool time_ops = false, graphs = true;
  int chunks_in_flight = 0;
  kernels::SamplingParams sampling;
  sampling.temperature = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--shapes") shapes = v;
    else if (a == "--batches") batches = Ints(v);
    else if (a == "--contexts") contexts = Ints(v);
    else if (a == "--steps") steps = std::stoi(v);
    else if (a == "--out-json") out_json = v;
    else if (a == "--time-ops") time_ops = v == "1";
    else if (a == "--graphs") graphs = v == "1";
    else if (a == "--chunks-in-flight") {
      chunks_in_flight = std::stoi(v);
      if (chunks_in_flight != 0 && chunks_in_flight != 1 && chunks_in_flight != 2 &&
          chunks_in_flight != 4) {
        std::fprintf(stderr, "--chunks-in-flight: %s is not one of 0, 1, 2, 4\n", v.c_str());
        return 2;
      }
    } else if (a == "--temperature")
      sampling.temperature = std::stof(v);
    else if (a == "--top-k") sampling.top_k = std::stoi(v);
    else if (a == "--top-p") sampling.top_p = std::stof(v);
    else if (a == "--kv-dtype") {
      bool known = false;
      for (kernels::KvDType t : {kernels::KvDType::kF32, kernels::KvDType::kBF16,
                                 kernels::KvDType::kF16, kernels::KvDType::kInt8}) {
        if (v == kernels::KvDTypeName(t)) g_kv_dtype = t, known = true;
      }
      if (!known) {
        std::fprintf(stderr, "--kv-dtype: %s is not one of f32, bf16, f16, int8\n", v.c_str());
        return 2;
      }
    } else if (a == "--weight-dtype") {
      if (v == "bf16")
        g_weight_dtype = kernels::DType::kBF16;
      else if (v == "int8")
        g_weight_dtype = kernels::DType::kI8;
      else if (v == "fp8")
        g_weight_dtype = kernels::DType::kF8E4M3;
      else {
        std::fprintf(stderr, "--weight-dtype: %s is not one of bf16, int8, fp8\n", v.c_str());
        return 2;
      }
    } else {
      std::fprintf(stderr, "unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  kernels::CudaBackendOptions backend_options;
  backend_options.time_ops = time_ops;
  backend_options.skinny_chunks_in_flight = chunks_in_flight;
  auto gpu = kernels::CreateCudaBackend(backend_options);
  if (!gpu.ok()) {
    std::printf("SKIP: %s\n", std::string(gpu.status().message()).c_str());
    return 0;
  }
  if ((g_weight_dtype == kernels::DType::kI8 && !(*gpu)->RunsInt8Weights()) ||
      (g_weight_dtype == kernels::DType::kF8E4M3 && !(*gpu)->RunsFp8Weights())) {
    std::printf("FAIL: the device's %s matmul failed its start-up check (the log says how)\n",
                kernels::DTypeName(g_weight_dtype));
    return 1;
  }
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  const double bw = CopyBandwidth((*gpu)->memory());
  std::printf("device: %s; device-to-device copy: %.0f GB/s (read + write)\n", prop.name, bw / 1e9);
  std::fflush(stdout);
  std::ostringstream js;
  js << "{\"device\": \"" << prop.name << "\", \"kv_dtype\": \"" << kernels::KvDTypeName(g_kv_dtype)
     << "\", \"weight_dtype\": \"" << kernels::DTypeName(g_weight_dtype)
     << "\", \"copy_gbs\": " << bw / 1e9 << ", \"results\": [";
  bool first = true;
  std::ostringstream extra;
  for (absl::string_view name : absl::StrSplit(shapes, ',')) {
    const Shape s = MakeShape(std::string(name));
    if (s.c.dim == 0) {
      std::fprintf(stderr, "unknown shape %s\n", std::string(name).c_str());
      return 2;
    }
    DeviceModel dm;
    MakeDeviceModel(s.c, (*gpu)->memory(), dm);
    std::printf("%s: %.2f GB of weights read per step (%s linear weights)\n", s.name.c_str(),
                dm.weight_bytes / 1e9, kernels::DTypeName(g_weight_dtype));
    for (int ctx : contexts) {
      for (int b : batches) {
        const Result r = RunDecode(s, dm, **gpu, sampling, b, ctx, steps, bw, graphs);
        CHECK_OK((*gpu)->Health());
        std::printf(
            "recall %-13s batch %2d ctx %5d: %s %8.3f ms/step %9.0f tok/s  roofline %.3f ms "
            "-> %.0f%% of roofline (%lld steps from graphs)\n",
            r.shape.c_str(), b, ctx, r.status.c_str(), r.step_ms, r.tokens_per_s, r.roofline_ms,
            100 * r.roofline_fraction, static_cast<long long>(r.graph_replays));
        std::fflush(stdout);
        js << (first ? "" : ", ") << "{\"shape\": \"" << r.shape << "\", \"batch\": " << b
           << ", \"context\": " << ctx << ", \"status\": \"" << r.status
           << "\", \"step_ms\": " << r.step_ms << ", \"tokens_per_s\": " << r.tokens_per_s
           << ", \"roofline_ms\": " << r.roofline_ms
           << ", \"roofline_fraction\": " << r.roofline_fraction
           << ", \"graph_replays\": " << r.graph_replays << "}";
        first = false;
      }
    }
    if (s.name != "qwen2.5-0.5b") {
      const LazyCost lz = MeasureLazy(s, dm, **gpu, 1024, 0.3, steps, graphs);
      std::printf("lazy %-13s ctx 1024 budget 30%% (%d tokens): FullKV step %.3f ms, lazy step "
                  "%.3f ms -> overhead %.1f%%\n",
                  s.name.c_str(), lz.held, lz.full_ms, lz.lazy_ms,
                  100 * (lz.lazy_ms / lz.full_ms - 1));
      const int64_t full = SessionsThatFit(s.c, **gpu, 8192);
      const int64_t lazy = SessionsThatFit(s.c, **gpu, static_cast<int>(8192 * 0.3) + 16);
      std::printf(
          "sessions %-13s of 8K tokens in free memory (%s KV): FullKV %lld, lazy 30%% "
          "%lld (%.2fx)\n",
          s.name.c_str(), kernels::KvDTypeName(g_kv_dtype), static_cast<long long>(full),
          static_cast<long long>(lazy), full > 0 ? double(lazy) / full : 0.0);
      extra << ", \"" << s.name << "\": {\"lazy_full_ms\": " << lz.full_ms << ", \"lazy_ms\": "
            << lz.lazy_ms << ", \"sessions_full\": " << full << ", \"sessions_lazy30\": " << lazy
            << "}";
      std::fflush(stdout);
    }
  }
  js << "]" << extra.str() << "}";
  if (!out_json.empty()) std::ofstream(out_json) << js.str() << "\n";
  return 0;
}

}  // namespace
}  // namespace recall

int main(int argc, char** argv) { return recall::Main(argc, argv); }
