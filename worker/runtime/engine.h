// Engine: a model placed on its device(s), ready to run: the one place that makes backends,
// device copies of the weights, KV block pools, forward passes and tensor-parallel groups.
// The serving scheduler (worker/serving), `recall generate` and the benchmarks
// (worker/offline) all run on an Engine.
//
//   EngineOptions o;            // CPU, one rank, a quarter of available memory for KV
//   o.kv_cache_bytes = 256 << 20;
//   RECALL_ASSIGN_OR_RETURN(std::unique_ptr<Engine> e, Engine::Create(model, o));
//   ForwardPass& fwd = e->forward(0);  // rank 0's pass over e->pool(0)
//
// One rank: a backend (CPU, or CUDA with the weights copied to the device), a pool and a
// forward pass, all on the caller's thread. tp > 1: a tp::TpGroup (a thread, backend, shard,
// pool and forward pass per rank); RunAll steps every rank at once.
//
// Errors name the option field (flags::FieldError: tp, devices, tp_comm, kv_cache_bytes,
// kv_cache_fraction), never a flag; a main turns them into its flag names.
// Thread safety: as tp::TpGroup (accessors between RunAll calls or inside one, each rank's
// objects on its own thread).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cache/block_pool.h"
#include "kernels/backend.h"
#include "kernels/comm/communicator.h"
#include "worker/model/model.h"
#include "worker/runtime/device.h"
#include "worker/runtime/forward.h"
#include "worker/runtime/tp/tp_group.h"

namespace recall::runtime {

struct EngineOptions {
  Device device = Device::kCpu;
  int tp = 1;                     // ranks, each with its slice of the heads and the MLP
  std::vector<int> devices;       // CUDA ordinals, one per rank (default 0..tp-1)
  std::optional<TpComm> tp_comm;  // CUDA ranks' all-reduces (default NCCL)
  int threads = 0;                // CPU threads over all ranks (0: every core)
  // The KV pool(s) over all ranks; unset: kv_cache_fraction of the available host memory
  // (CPU) or of the free device memory after the weights (CUDA; with tp > 1, of each GPU's,
  // split between the ranks on it).
  std::optional<int64_t> kv_cache_bytes;
  double kv_cache_fraction = 0.25;
  int block_tokens = 16;  // tokens per KV block
  // How the KV pools store K and V (kernels/tensor.h KvDType): bf16 by default, half of fp32.
  kernels::KvDType kv_dtype = kernels::KvDType::kBF16;
  // Each rank's forward pass (its comm fields are set per rank).
  ForwardOptions forward{.batch_invariant = true};
  bool opaque_cpu_memory = false;  // testing: CPU ranks that act as device memory

  // InvalidArgument (a FieldError) for options that do not fit together, before anything
  // is made: devices or tp_comm without CUDA, not one device per rank, fractions out of
  // range.
  absl::Status Validate() const;
};

// Bytes of `tokens` tokens in every layer, in KV blocks of `block_tokens` of `dtype`, over all
// ranks.
int64_t KvBytesFor(const model::ModelConfig& config, int tokens, int block_tokens,
                   kernels::KvDType dtype);
// KvBytesFor one full context (config.max_seq_len): the default pool of one in-process
// sequence.
int64_t FullContextKvBytes(const model::ModelConfig& config, int block_tokens,
                           kernels::KvDType dtype);

class Engine {
 public:
  // `model` (host weights) must outlive the engine. The options' errors (Validate), a tp the
  // model does not allow (field tp), a pool smaller than one block per layer and rank
  // (kv_cache_bytes or kv_cache_fraction), the CUDA backend's errors.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const model::Model& model,
                                                        const EngineOptions& options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const EngineOptions& options() const { return options_; }
  const model::Model& model() const { return model_; }  // the host weights (full config)
  int tp() const { return options_.tp; }

  // Rank r's parts.
  kernels::Backend& backend(int r);
  const model::Model& weights(int r);  // the rank's weights in its backend's memory
  cache::BlockPool& pool(int r);
  ForwardPass& forward(int r);
  kernels::Communicator* comm(int r);            // host-value communicator; null for one rank
  int kv_head_offset(int r);                     // the model-global index of the rank's KV head 0
  tp::TpGroup* group() { return group_.get(); }  // null for one rank

  // Calls fn(r) for every rank at once (each on its rank's thread) and waits; fn(0) directly
  // for one rank. Returns the first error.
  absl::Status RunAll(const std::function<absl::Status(int)>& fn);

  int64_t kv_bytes() const { return kv_bytes_; }  // every rank's pool
  // One line for a startup log: device(s), ranks, the pool.
  std::string Summary() const;

 private:
  Engine(const model::Model& model, const EngineOptions& options)
      : model_(model), options_(options) {}
  absl::Status CreateOneRank();
  absl::Status CreateGroup();

  const model::Model& model_;
  const EngineOptions options_;
  // One rank (destroyed bottom up: the pass and pool before the weights and backend).
  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<model::Model> uploaded_;  // CUDA: the device copy
  std::unique_ptr<cache::BlockPool> pool_;
  std::unique_ptr<ForwardPass> forward_;
  // tp > 1.
  std::unique_ptr<tp::TpGroup> group_;
  int64_t kv_bytes_ = 0;
};

}  // namespace recall::runtime
