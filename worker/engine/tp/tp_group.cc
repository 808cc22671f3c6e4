#include "worker/engine/tp/tp_group.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace recall::engine::tp {

absl::StatusOr<std::unique_ptr<TpGroup>> TpGroup::Create(const model::Model& full,
                                                         const TpGroupOptions& options) {
  RECALL_RETURN_IF_ERROR(MakeTpLayout(full.config, options.tp, 0).status());  // tp fits the model
  if (options.device != "cpu") {
    if (options.device == "cuda") {
      // What is missing: the ranks' NCCL all-reduces must be ordered with each backend's
      // stream, and the evictors' collectives (on host buffers) need a host communicator
      // beside NCCL. Until then: one GPU per worker, or CPU ranks.
      return absl::UnimplementedError(
          "tensor parallelism on CUDA ranks is not wired yet; use --tp 1 with --device cuda "
          "(one GPU per worker) or --device cpu ranks");
    }
    return absl::InvalidArgumentError(
        absl::StrCat("device: \"", options.device, "\" is not one of cpu, cuda"));
  }
  if (options.threads_per_rank < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("threads_per_rank: ", options.threads_per_rank, " must be >= 0"));
  }
  kernels::InProcessGroupOptions comm_options;
  comm_options.timeout = options.collective_timeout;
  RECALL_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<kernels::Communicator>> comms,
                          kernels::CreateInProcessGroup(options.tp, comm_options));
  const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int threads = options.threads_per_rank > 0 ? options.threads_per_rank
                                                   : std::max(1, hw / options.tp);
  std::unique_ptr<TpGroup> group(new TpGroup(full));
  for (int r = 0; r < options.tp; ++r) {
    auto rank = std::make_unique<Rank>();
    RECALL_ASSIGN_OR_RETURN(rank->layout, MakeTpLayout(full.config, options.tp, r));
    RECALL_ASSIGN_OR_RETURN(rank->model, ShardModel(full, options.tp, r));
    kernels::CpuBackendOptions backend_options;
    backend_options.num_threads = threads;
    rank->backend = kernels::CreateCpuBackend(backend_options);
    rank->comm = std::move(comms[static_cast<size_t>(r)]);
    const model::ModelConfig& c = rank->model->config;
    kernels::PagedKvLayout layout{c.n_layers, c.n_kv_heads, c.head_dim, options.block_tokens};
    RECALL_ASSIGN_OR_RETURN(rank->pool,
                            cache::BlockPool::CreateWithBytes(layout, options.kv_bytes_per_rank));
    ForwardOptions fo = options.forward;
    fo.comm = options.tp > 1 ? rank->comm.get() : nullptr;
    rank->forward = std::make_unique<ForwardPass>(*rank->model, *rank->backend, fo);
    group->ranks_.push_back(std::move(rank));
  }
  {
    absl::MutexLock lock(&group->mu_);
    group->results_.resize(static_cast<size_t>(options.tp));
  }
  for (int r = 1; r < options.tp; ++r) {
    group->threads_.emplace_back([g = group.get(), r] { g->WorkerLoop(r); });
  }
  return group;
}

TpGroup::~TpGroup() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    work_cv_.SignalAll();
  }
  for (std::thread& t : threads_) t.join();
}

void TpGroup::WorkerLoop(int rank) {
  uint64_t seen = 0;
  while (true) {
    const std::function<absl::Status(int)>* job = nullptr;
    {
      absl::MutexLock lock(&mu_);
      while (!stop_ && generation_ == seen) work_cv_.Wait(&mu_);
      if (stop_) return;
      seen = generation_;
      job = job_;
    }
    absl::Status st = (*job)(rank);
    absl::MutexLock lock(&mu_);
    results_[static_cast<size_t>(rank)] = std::move(st);
    if (--pending_ == 0) done_cv_.Signal();
  }
}

absl::Status TpGroup::Run(const std::function<absl::Status(int rank)>& fn) {
  {
    absl::MutexLock lock(&mu_);
    job_ = &fn;
    pending_ = tp() - 1;
    ++generation_;
    work_cv_.SignalAll();
  }
  absl::Status mine = fn(0);
  absl::MutexLock lock(&mu_);
  while (pending_ > 0) done_cv_.Wait(&mu_);
  job_ = nullptr;
  results_[0] = std::move(mine);
  // A rank's own failure explains the others' (a peer that gave up waiting on it, a failed
  // group): report the first error that is not a secondary one, else the first.
  const absl::Status* first = nullptr;
  for (const absl::Status& st : results_) {
    if (st.ok()) continue;
    if (first == nullptr) first = &st;
    const bool secondary = absl::StrContains(st.message(), "tensor-parallel group:");
    if (!secondary) return st;
  }
  return first == nullptr ? absl::OkStatus() : *first;
}

}  // namespace recall::engine::tp
