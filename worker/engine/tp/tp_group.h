// TpGroup: a model run over `tp` ranks (ARCHITECTURE.md "Tensor parallel"). Each rank has its
// shard of the weights (shard.h), its own backend, KV block pool, ForwardPass and
// communicator, and its own thread: Run(fn) calls fn(rank) on every rank's thread at once
// and waits for all, which is how the collectives inside fn meet.
//
// CPU ranks use the in-process communicator. CUDA ranks (one device each, NCCL) are not wired
// yet: a CUDA group is Unimplemented (see TpGroup::Create).
//
// Thread safety: Run is called by one thread at a time; the accessors are for use inside fn
// (rank r's objects by rank r's thread) or between Runs.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cache/block_pool.h"
#include "kernels/backend.h"
#include "kernels/comm/communicator.h"
#include "worker/engine/forward.h"
#include "worker/engine/tp/shard.h"
#include "worker/model/model.h"

namespace recall::engine::tp {

struct TpGroupOptions {
  int tp = 1;
  // "cpu" (in-process ranks) or "cuda" (NCCL; needs the CUDA backend).
  std::string device = "cpu";
  // CUDA device ordinals, one per rank (default 0..tp-1).
  std::vector<int> devices;
  // CPU threads of each rank's backend; 0 = hardware threads / tp (at least 1).
  int threads_per_rank = 0;
  // KV pool of each rank, in bytes (each rank holds its own KV heads' slice of every session).
  int64_t kv_bytes_per_rank = 64ll << 20;
  int block_tokens = 16;
  ForwardOptions forward;  // comm is set per rank
  // A rank waiting longer than this for its peers fails the group.
  absl::Duration collective_timeout = absl::Seconds(120);
};

class TpGroup {
 public:
  // Shards `full` (which must outlive the group). InvalidArgument for a tp the model's heads
  // or MLP width do not allow, or bad options; Unimplemented for device "cuda".
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
  kernels::Communicator& comm(int r) { return *ranks_[r]->comm; }
  cache::BlockPool& pool(int r) { return *ranks_[r]->pool; }
  ForwardPass& forward(int r) { return *ranks_[r]->forward; }

 private:
  struct Rank {
    TpLayout layout;
    std::unique_ptr<model::Model> model;
    std::unique_ptr<kernels::Backend> backend;
    std::unique_ptr<kernels::Communicator> comm;
    std::unique_ptr<cache::BlockPool> pool;
    std::unique_ptr<ForwardPass> forward;
  };
  explicit TpGroup(const model::Model& full) : full_(full) {}
  void WorkerLoop(int rank);

  const model::Model& full_;
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

}  // namespace recall::engine::tp
