// The cost of tensor-parallel eviction agreement (EVICTION.md section 5): at TP = 2 on CPU
// ranks (threads, in-process communicator), a LazyEviction decode loop per TP eviction mode,
// timing the collectives the evictors call (the step broadcast, the shared-token all-reduce,
// the head-adaptive all-gather, the --tp-verify checksum) against the whole decode step
// (forward pass with its all-reduces + eviction) measured in the same loop. Reported per
// step and on the steps where a layer actually evicted (lazy: every W steps).
//
// usage: recall_tp_eviction_bench [--shape NAME | --config PATH] [--tp N] [--prompt N]
//                                 [--steps N] [--window W] [--dtype bf16|f32]
//                                 [--device cpu|cuda] [--devices 0,0] [--tp-comm nccl|staged]
// On CUDA ranks the evictors' collectives are the same host collectives (their scores are
// host arrays); the step then includes the ranks' NCCL (or staged) activation all-reduces.
// Random weights of the shape (default qwen2.5-0.5b: 14 query heads, 2 KV heads, so TP = 2
// gives each rank one KV head; SmolLM2-135M's 9 heads do not split in two).
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "bench/shapes.h"
#include "common/clock.h"
#include "common/flags.h"
#include "worker/model/random_model.h"
#include "worker/offline/sequence.h"
#include "worker/offline/tp_sequence.h"
#include "worker/runtime/tp/tp_group.h"

namespace recall::bench {
namespace {

// Times every collective of the wrapped communicator (wall time, so waiting for a slower
// peer counts: that is what the step pays).
class TimedCommunicator final : public kernels::Communicator {
 public:
  explicit TimedCommunicator(kernels::Communicator& inner) : inner_(inner) {}
  const char* Name() const override { return inner_.Name(); }
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  absl::Status AllReduce(void* d, int64_t n, kernels::CommDType t, kernels::ReduceOp op) override {
    return Time([&] { return inner_.AllReduce(d, n, t, op); });
  }
  absl::Status AllGather(const void* s, void* r, int64_t n, kernels::CommDType t) override {
    return Time([&] { return inner_.AllGather(s, r, n, t); });
  }
  absl::Status Broadcast(void* d, int64_t n, kernels::CommDType t, int root) override {
    return Time([&] { return inner_.Broadcast(d, n, t, root); });
  }
  absl::Status Barrier() override { return Time([&] { return inner_.Barrier(); }); }
  double seconds() const { return ns_.load() * 1e-9; }
  int64_t calls() const { return calls_.load(); }

 private:
  template <typename F>
  absl::Status Time(F f) {
    Stopwatch w;
    absl::Status st = f();
    ns_ += static_cast<int64_t>(w.ElapsedSeconds() * 1e9);
    ++calls_;
    return st;
  }
  kernels::Communicator& inner_;
  std::atomic<int64_t> ns_{0};
  std::atomic<int64_t> calls_{0};
};

struct Flags {
  std::string shape = "qwen2.5-0.5b";
  std::string config;  // a config.json instead of a named shape
  int tp = 2;
  int prompt = 512;
  int steps = 128;
  int window = 32;
  std::string dtype = "bf16";
  std::string device = "cpu";
  std::vector<int> devices;  // CUDA ranks' devices (default 0..tp-1)
  std::string tp_comm;       // CUDA ranks: nccl (default) or staged
};

const flags::FlagSet<Flags>& TpEvictionFlags() {
  static const flags::FlagSet<Flags> f = [] {
    flags::FlagSet<Flags> s;
    s.Choice("shape", "NAME", "smollm2-135m, qwen2.5-0.5b (default), llama-3.2-1b or llama-3-8b",
             [](auto& o) -> auto& { return o.shape; },
             {"smollm2-135m", "qwen2.5-0.5b", "llama-3.2-1b", "llama-3-8b"})
        .String(
            "config", "PATH", "a config.json instead of --shape (wins over it)",
            [](auto& o) -> auto& { return o.config; })
        .Int(
            "tp", "N", "ranks (default 2)", [](auto& o) -> auto& { return o.tp; }, 1, 1024)
        .Int(
            "prompt", "N", "prompt tokens, and the lazy budget C (default 512)",
            [](auto& o) -> auto& { return o.prompt; }, 1, 1 << 20)
        .Int(
            "steps", "N", "decode steps (default 128)", [](auto& o) -> auto& { return o.steps; }, 1,
            1 << 24)
        .Int(
            "window", "W", "lazy's window (default 32)", [](auto& o) -> auto& { return o.window; },
            1, 1 << 20)
        .Choice("dtype", "TYPE", "weight type: bf16 (default) or f32",
                [](auto& o) -> auto& { return o.dtype; }, {"bf16", "f32"})
        .Choice("device", "NAME", "cpu (default; ranks are threads) or cuda",
                [](auto& o) -> auto& { return o.device; }, {"cpu", "cuda"})
        .Value(
            "devices", "LIST", "CUDA ranks' device ordinals, e.g. 0,0 (default 0..N-1)",
            [](auto& o) -> auto& { return o.devices; }, 0, 1024)
        .Choice("tp-comm", "KIND", "CUDA ranks' activation all-reduces: nccl (default) or staged",
                [](auto& o) -> auto& { return o.tp_comm; }, {"nccl", "staged"});
    return s;
  }();
  return f;
}

struct Row {
  double step_ms = 0, comm_ms = 0;            // mean per step
  double evict_step_ms = 0, evict_comm_ms = 0;  // mean over steps that evicted
  int evict_steps = 0;
  double calls_per_step = 0;
};

// One decode loop; `mode` empty means FullKV (no evictor: no eviction collectives).
Row RunMode(const model::Model& model, const Flags& f, const std::string& mode, bool verify) {
  runtime::tp::TpGroupOptions g;
  g.tp = f.tp;
  g.threads_per_rank = 1;
  g.device = f.device == "cuda" ? runtime::Device::kCuda : runtime::Device::kCpu;
  g.devices = f.devices;
  if (!f.tp_comm.empty()) {
    g.tp_comm = f.tp_comm == "staged" ? runtime::TpComm::kStaged : runtime::TpComm::kNccl;
  }
  const model::ModelConfig& c = model.config;
  g.kv_bytes_per_rank =
      int64_t{c.n_layers} * ((f.prompt + f.steps) / 16 + 4) * 16 * c.n_kv_heads * c.head_dim * 8 /
          f.tp + (1 << 20);
  g.forward.max_batch_tokens = f.prompt;
  auto group = runtime::tp::TpGroup::Create(model, g);
  if (!group.ok()) {
    std::fprintf(stderr, "%s\n", std::string(group.status().message()).c_str());
    std::exit(1);
  }
  std::vector<std::unique_ptr<TimedCommunicator>> timed;
  std::vector<std::unique_ptr<offline::LocalSequence>> seqs;
  for (int r = 0; r < f.tp; ++r) {
    timed.push_back(std::make_unique<TimedCommunicator>((*group)->comm(r)));
    std::optional<cache::eviction::SessionEvictorOptions> o;
    if (!mode.empty()) {
      cache::eviction::SessionEvictorOptions base;
      base.policy.name = "lazy";
      base.policy.window = f.window;
      base.budget.budget = f.prompt;  // the cache stays in [C, C + W]
      base.verify_keep = verify;
      if (!cache::eviction::ApplyTpEvictionMode(mode, base).ok()) std::exit(2);
      o = offline::RankEvictorOptions(**group, r, base);
      o->comm = f.tp > 1 ? timed.back().get() : nullptr;
    }
    auto s = offline::LocalSequence::Create((*group)->forward(r), (*group)->pool(r), o);
    if (!s.ok()) {
      std::fprintf(stderr, "%s\n", std::string(s.status().message()).c_str());
      std::exit(1);
    }
    seqs.push_back(std::move(*s));
  }
  std::vector<int32_t> prompt(f.prompt);
  for (int i = 0; i < f.prompt; ++i) prompt[i] = (i * 7919 + 13) % c.vocab_size;
  std::vector<float> logits(c.vocab_size);
  auto run = [&](auto&& fn) {
    absl::Status st = (*group)->Run(fn);
    if (!st.ok()) {
      std::fprintf(stderr, "%s\n", std::string(st.message()).c_str());
      std::exit(1);
    }
  };
  run([&](int r) { return seqs[r]->Prefill(prompt, f.prompt, r == 0 ? logits.data() : nullptr); });
  Row row;
  int64_t calls = 0;
  for (int i = 0; i < f.steps; ++i) {
    const int32_t token = (i * 31 + 7) % c.vocab_size;
    const double comm_before = timed[0]->seconds();
    const int64_t calls_before = timed[0]->calls();
    auto evictions = [&] {  // every rank's: under head-adaptive one rank may keep all it has
      int64_t n = 0;
      for (const auto& s : seqs) n += s->stats().evictions;
      return n;
    };
    const int64_t ev_before = evictions();
    Stopwatch w;
    run([&](int r) { return seqs[r]->Decode(token, r == 0 ? logits.data() : nullptr); });
    const double step = w.ElapsedSeconds() * 1e3;
    const double comm = (timed[0]->seconds() - comm_before) * 1e3;
    calls += timed[0]->calls() - calls_before;
    row.step_ms += step / f.steps;
    row.comm_ms += comm / f.steps;
    if (evictions() > ev_before) {
      ++row.evict_steps;
      row.evict_step_ms += step;
      row.evict_comm_ms += comm;
    }
  }
  if (row.evict_steps > 0) {
    row.evict_step_ms /= row.evict_steps;
    row.evict_comm_ms /= row.evict_steps;
  }
  row.calls_per_step = static_cast<double>(calls) / f.steps;
  return row;
}

constexpr char kUsageHead[] =
    R"U(usage: recall_tp_eviction_bench [--shape NAME | --config PATH] [--tp N] [--prompt N]
                                [--steps N] [--window W] [--dtype bf16|f32]
                                [--device cpu|cuda] [--devices LIST] [--tp-comm nccl|staged]

The cost of tensor-parallel eviction agreement: a lazy decode loop (budget C = --prompt) per
TP eviction mode (uniform, shared, head-adaptive; each also with --tp-verify), timing the
collectives the evictors call against the whole decode step in the same loop, per step and
on the steps where a layer evicted; and a FullKV step without an evictor for reference.
Random weights.

options:
)U";

int Main(int argc, char** argv) {
  Flags f;
  if (int rc = ParseBenchFlags(argc, argv, "recall_tp_eviction_bench", kUsageHead,
                               TpEvictionFlags(), &f);
      rc >= 0) {
    return rc;
  }
  absl::StatusOr<model::ModelConfig> config = NamedShape(f.shape);
  if (!f.config.empty()) config = model::ReadHfConfig(f.config);
  if (!config.ok() || config->dim == 0) {
    std::fprintf(stderr, "--shape/--config: %s\n",
                 config.ok() ? "unknown shape" : std::string(config.status().message()).c_str());
    return 2;
  }
  config->max_seq_len = std::max(config->max_seq_len, f.prompt + f.steps + 1);
  auto model = model::MakeRandomModel(
      *config, f.dtype == "f32" ? kernels::DType::kF32 : kernels::DType::kBF16, 1);
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", std::string(model.status().message()).c_str());
    return 1;
  }
  const std::string ranks =
      f.device == "cuda" ? "CUDA ranks (" + (f.tp_comm.empty() ? std::string("nccl") : f.tp_comm) +
                               " activation all-reduces)"
                         : std::string("CPU ranks (1 thread each)");
  std::printf("TP eviction collectives: %s, random %s weights, tp=%d %s, lazy C=%d W=%d, %d "
              "decode steps after a %d-token prompt\n",
              f.config.empty() ? f.shape.c_str() : f.config.c_str(), f.dtype.c_str(), f.tp,
              ranks.c_str(), f.prompt, f.window, f.steps, f.prompt);
  const Row full = RunMode(**model, f, "", false);
  std::printf("baseline FullKV step (no evictor): %.2f ms\n", full.step_ms);
  std::printf("%-22s %9s %9s %7s %8s | %6s %11s %11s %7s\n", "mode", "step_ms", "coll_ms",
              "share", "calls", "evicts", "evict_step", "evict_coll", "share");
  for (const char* mode : {"uniform", "shared", "head-adaptive"}) {
    for (const bool verify : {false, true}) {
      const Row r = RunMode(**model, f, mode, verify);
      const std::string name = std::string(mode) + (verify ? " +verify" : "");
      std::printf("%-22s %9.2f %9.3f %6.1f%% %8.1f | %6d %11.2f %11.3f %6.1f%%\n", name.c_str(),
                  r.step_ms, r.comm_ms, 100.0 * r.comm_ms / r.step_ms, r.calls_per_step,
                  r.evict_steps, r.evict_step_ms, r.evict_comm_ms,
                  r.evict_steps > 0 ? 100.0 * r.evict_comm_ms / r.evict_step_ms : 0.0);
    }
  }
  std::printf("coll_ms: rank 0's wall time inside the evictors' collectives per step (waiting "
              "for the peer included); share: of the step; evict_*: the steps where a layer "
              "evicted\n");
  return 0;
}

}  // namespace
}  // namespace recall::bench

int main(int argc, char** argv) { return recall::bench::Main(argc, argv); }
