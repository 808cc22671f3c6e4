// TpGroup: a model run over `tp` ranks (ARCHITECTURE.md "Tensor parallel"). Each rank has its
// shard of the weights (shard.h), its own backend, KV block pool, ForwardPass and
// communicator, and its own thread: Run(fn) calls fn(rank) on every rank's thread at once
// and waits for all, which is how the collectives inside fn meet.
//
// Each rank has two communicators (ForwardOptions): comm(r), for host values, is always the
// in-process group (the evictors' scores and decisions are host arrays, and so is the forward
// pass's reservation vote); the activations' all-reduces go through the same group on CPU
// ranks and, on CUDA ranks, through NCCL queued on the rank's backend stream (one distinct GPU
// per rank) or through a staged group (host copies; several ranks may share one GPU, which
// NCCL refuses, so a one-GPU machine can run and check a tp > 1 worker).
//
// CUDA ranks: rank r's weights shard is uploaded to devices[r], its KV pool is device memory,
// and its thread is bound to that device (rank 0's on every Run).
//
// Thread safety: Run is called by one thread at a time; the accessors are for use inside fn
// (rank r's objects by rank r's thread) or between Runs.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cache/block_pool.h"
#include "kernels/backend.h"
#include "kernels/comm/communicator.h"
#include "worker/model/model.h"
#include "worker/runtime/device.h"
#include "worker/runtime/forward.h"
#include "worker/runtime/tp/shard.h"

namespace recall::runtime::tp {

struct TpGroupOptions {
  int tp = 1;
  Device device = Device::kCpu;
  // CUDA device ordinals, one per rank (default 0..tp-1). A device may repeat only with
  // tp_comm kStaged.
  std::vector<int> devices;
  // How CUDA ranks all-reduce activations (default NCCL). Unset for CPU ranks (they use the
  // in-process group).
  std::optional<TpComm> tp_comm;
  // CPU threads of each rank's backend; 0 = hardware threads / tp (at least 1).
  int threads_per_rank = 0;
  // Testing, CPU ranks: backends with kernels::CpuBackendOptions::opaque_memory and the
  // staged group for the activations, i.e. the CUDA ranks' code paths on the CPU.
  bool opaque_cpu_memory = false;
  // KV pool of each rank, in bytes (each rank holds its own KV heads' slice of every session).
  int64_t kv_bytes_per_rank = 64ll << 20;
  // CUDA ranks: when > 0, overrides kv_bytes_per_rank: this fraction of each device's free
  // memory once every rank's weights are on it, split evenly between the ranks on the device.
  double kv_cache_fraction = 0;
  int block_tokens = 16;
  kernels::KvDType kv_dtype = kernels::KvDType::kF32;  // how the pools store K and V
  ForwardOptions forward;  // comm is set per rank
  // A rank waiting longer than this for its peers fails the group.
  absl::Duration collective_timeout = absl::Seconds(120);
};

class TpGroup {
 public:
  // Shards `full` (which must outlive the group). InvalidArgument for a tp the model's heads
  // or MLP width do not allow, or bad options (a flags::FieldError naming the option: tp,
  // devices, tp_comm, kv_cache_fraction; kv_cache_bytes for a kv_bytes_per_rank too small);
  // for device cuda, the
  // CUDA backend's error (Unimplemented without CUDA, FailedPrecondition without a GPU),
  // ResourceExhausted when a shard or pool does not fit, NCCL's error.
  static absl::StatusOr<std::unique_ptr<TpGroup>> Create(const model::Model& full,
                                                         const TpGroupOptions& options);
  ~TpGroup();
  TpGroup(const TpGroup&) = delete;
  TpGroup& operator=(const TpGroup&) = delete;

  int tp() const { return static_cast<int>(ranks_.size()); }
  const model::Model& full_model() const { return full_; }

  // Calls fn(r) on rank r's thread for every r (rank 0 on the calling thread) and waits for
  // all. Returns the first error by rank order, preferring a rank's own error over the
  // secondary errors of ranks that were waiting for it.
  absl::Status Run(const std::function<absl::Status(int rank)>& fn);

  const TpLayout& layout(int r) const { return ranks_[r]->layout; }
  const model::Model& shard(int r) const { return *ranks_[r]->model; }
  kernels::Backend& backend(int r) { return *ranks_[r]->backend; }
  // Rank r's communicator for host buffers (what evictors and TpSequence use).
  kernels::Communicator& comm(int r) { return *ranks_[r]->comm; }
  // "in-process", "nccl" or "staged": what carries the activations' all-reduces.
  const std::string& collectives() const { return collectives_; }
  // Rank r's CUDA device, or -1 for a CPU rank.
  int cuda_device(int r) const { return ranks_[r]->cuda_device; }
  cache::BlockPool& pool(int r) { return *ranks_[r]->pool; }
  ForwardPass& forward(int r) { return *ranks_[r]->forward; }

 private:
  // Members are destroyed bottom up: everything in the backend's memory (weights, pool) and
  // the communicators (NCCL may borrow its stream) go before the backend.
  struct Rank {
    TpLayout layout;
    std::unique_ptr<kernels::Backend> backend;
    std::unique_ptr<model::Model> model;
    int cuda_device = -1;
    std::unique_ptr<kernels::Communicator> comm;         // host buffers
    std::unique_ptr<kernels::Communicator> device_comm;  // activations (null: comm)
    std::unique_ptr<cache::BlockPool> pool;
    std::unique_ptr<ForwardPass> forward;
  };
  explicit TpGroup(const model::Model& full) : full_(full) {}
  // Rank r's backend and weights, on the CPU or on its CUDA device (bound to this thread).
  static absl::StatusOr<std::unique_ptr<Rank>> CreateRank(const model::Model& full,
                                                          const TpGroupOptions& options, int r,
                                                          int cuda_device);
  // Every rank's KV pool in its backend's memory (TpGroupOptions kv_bytes_per_rank or
  // kv_fraction); InvalidArgument when a pool would hold less than one block per layer.
  absl::Status CreatePools(const TpGroupOptions& options);
  // The activations' communicators of ranks whose backend memory the host cannot read (CUDA,
  // or opaque CPU memory); `collectives_` says which.
  absl::Status ConnectDeviceRanks(const TpGroupOptions& options);
  void WorkerLoop(int rank);

  const model::Model& full_;
  std::string collectives_ = "in-process";
  std::vector<std::unique_ptr<Rank>> ranks_;
  std::vector<std::thread> threads_;  // ranks 1..tp-1
  absl::Mutex mu_;
  absl::CondVar work_cv_;  // a new job or stop
  absl::CondVar done_cv_;  // pending_ reached 0
  const std::function<absl::Status(int)>* job_ ABSL_GUARDED_BY(mu_) = nullptr;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  int pending_ ABSL_GUARDED_BY(mu_) = 0;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<absl::Status> results_ ABSL_GUARDED_BY(mu_);
};

}  // namespace recall::runtime::tp
