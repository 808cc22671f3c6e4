#include "worker/runtime/tp/tp_group.h"

#include <algorithm>
#include <map>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/flags.h"
#include "common/status.h"
#include "kernels/cuda_backend.h"
#include "worker/model/upload.h"

namespace recall::runtime::tp {

namespace {

// The CUDA devices of the ranks: options.devices, or 0..tp-1.
absl::StatusOr<std::vector<int>> RankDevices(const TpGroupOptions& options) {
  std::vector<int> devices = options.devices;
  if (devices.empty()) {
    for (int r = 0; r < options.tp; ++r) devices.push_back(r);
  }
  if (static_cast<int>(devices.size()) != options.tp) {
    return flags::FieldError("devices", absl::StrCat(devices.size(), " devices for {tp} ",
                                                     options.tp, "; give one per rank"));
  }
  const bool staged = options.tp_comm == TpComm::kStaged;
  if (!staged) {
    for (size_t i = 0; i < devices.size(); ++i) {
      for (size_t j = 0; j < i; ++j) {
        if (devices[i] == devices[j]) {
          return flags::FieldError(
              "devices", absl::StrCat("CUDA device ", devices[i],
                                      " is given to two ranks; NCCL needs one device per rank "
                                      "({tp_comm} staged lets ranks share a GPU)"));
        }
      }
    }
  }
  const int visible = kernels::CudaDeviceCount();
  if (visible == 0) {
    return flags::FieldError("device", "cuda: no CUDA device is visible to this process",
                             absl::StatusCode::kFailedPrecondition);
  }
  for (int d : devices) {
    if (d < 0 || d >= visible) {
      return flags::FieldError(
          "devices",
          absl::StrCat("CUDA device ", d, " does not exist (", visible, " visible)",
                       staged ? ""
                              : absl::StrCat("; tp ", options.tp,
                                             " needs one GPU per rank, or {tp_comm} staged to "
                                             "share fewer")),
          absl::StatusCode::kFailedPrecondition);
    }
  }
  return devices;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TpGroup::Rank>> TpGroup::CreateRank(const model::Model& full,
                                                                   const TpGroupOptions& options,
                                                                   int r, int cuda_device) {
  auto rank = std::make_unique<Rank>();
  rank->cuda_device = cuda_device;
  RECALL_ASSIGN_OR_RETURN(rank->layout, MakeTpLayout(full.config, options.tp, r));
  RECALL_ASSIGN_OR_RETURN(std::unique_ptr<model::Model> shard, ShardModel(full, options.tp, r));
  if (cuda_device >= 0) {
    RECALL_RETURN_IF_ERROR(kernels::CudaBindThread(cuda_device));
    RECALL_ASSIGN_OR_RETURN(rank->backend,
                            MakeBackend({.device = Device::kCuda, .cuda_device = cuda_device}));
    RECALL_ASSIGN_OR_RETURN(rank->model, model::UploadModel(*shard, rank->backend->memory()));
  } else {
    const int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    RECALL_ASSIGN_OR_RETURN(
        rank->backend,
        MakeBackend({.device = Device::kCpu,
                     .cpu_threads = options.threads_per_rank > 0 ? options.threads_per_rank
                                                                 : std::max(1, hw / options.tp),
                     .opaque_cpu_memory = options.opaque_cpu_memory}));
    rank->model = std::move(shard);
  }
  RECALL_RETURN_IF_ERROR(
      CheckBackendRunsWeights(full.config.weight_dtype, *rank->backend, absl::StrCat("rank ", r)));
  return rank;
}

absl::Status TpGroup::CreatePools(const TpGroupOptions& options) {
  // With kv_fraction, each device's free memory (after every rank's weights) is split evenly
  // between the ranks on it.
  std::map<int, int64_t> free_per_rank;
  if (options.kv_cache_fraction > 0) {
    std::map<int, int> ranks_on;
    for (const auto& rank : ranks_) ++ranks_on[rank->cuda_device];
    for (const auto& [device, n] : ranks_on) {
      RECALL_ASSIGN_OR_RETURN(const int64_t free_bytes, kernels::CudaFreeMemory(device));
      free_per_rank[device] =
          static_cast<int64_t>(options.kv_cache_fraction * static_cast<double>(free_bytes)) / n;
    }
  }
  for (auto& rank : ranks_) {
    const int64_t bytes = options.kv_cache_fraction > 0 ? free_per_rank[rank->cuda_device]
                                                        : options.kv_bytes_per_rank;
    const model::ModelConfig& c = rank->model->config;
    kernels::PagedKvLayout layout{c.n_layers, c.n_kv_heads, c.head_dim, options.block_tokens,
                                  options.kv_dtype};
    const int64_t per_layer = layout.BlockBytes() * layout.n_layers;
    if (bytes < per_layer) {
      return flags::FieldError(
          options.kv_cache_fraction > 0 ? "kv_cache_fraction" : "kv_cache_bytes",
          absl::StrCat(bytes, " bytes per rank is less than one KV block per layer (", per_layer,
                       " bytes)"));
    }
    RECALL_ASSIGN_OR_RETURN(
        rank->pool, cache::BlockPool::CreateWithBytes(layout, bytes, rank->backend->memory()));
  }
  return absl::OkStatus();
}

absl::Status TpGroup::ConnectDeviceRanks(const TpGroupOptions& options) {
  const std::string kind = options.device != Device::kCuda
                               ? "staged"
                               : TpCommName(options.tp_comm.value_or(TpComm::kNccl));
  std::vector<std::unique_ptr<kernels::Communicator>> comms;
  if (kind == "nccl") {
    std::vector<int> devices;
    std::vector<void*> streams;
    for (const auto& rank : ranks_) {
      devices.push_back(rank->cuda_device);
      streams.push_back(kernels::CudaStreamOf(*rank->backend));
    }
    RECALL_ASSIGN_OR_RETURN(comms, kernels::CreateNcclGroup(devices, streams));
  } else {
    std::vector<kernels::Memory*> memories;
    for (const auto& rank : ranks_) memories.push_back(&rank->backend->memory());
    kernels::InProcessGroupOptions comm_options;
    comm_options.timeout = options.collective_timeout;
    RECALL_ASSIGN_OR_RETURN(comms, kernels::CreateStagedGroup(memories, comm_options));
  }
  for (size_t r = 0; r < ranks_.size(); ++r) ranks_[r]->device_comm = std::move(comms[r]);
  collectives_ = kind;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<TpGroup>> TpGroup::Create(const model::Model& full,
                                                         const TpGroupOptions& options) {
  RECALL_RETURN_IF_ERROR(MakeTpLayout(full.config, options.tp, 0).status());  // tp fits the model
  const bool cuda = options.device == Device::kCuda;
  if (options.threads_per_rank < 0) {
    return flags::FieldError("threads_per_rank",
                             absl::StrCat(options.threads_per_rank, " must be >= 0"));
  }
  if (!cuda && !options.devices.empty()) {
    return flags::FieldError("devices", "only for {device} cuda");
  }
  if (!cuda && options.tp_comm.has_value()) {
    return flags::FieldError("tp_comm",
                             "only for {device} cuda (CPU ranks use the in-process group)");
  }
  if (options.kv_cache_fraction != 0 &&
      (!cuda || options.kv_cache_fraction < 0 || options.kv_cache_fraction > 1)) {
    return flags::FieldError(
        "kv_cache_fraction",
        absl::StrCat(options.kv_cache_fraction, " must be in (0, 1], and only for device cuda"));
  }
  std::vector<int> devices(static_cast<size_t>(options.tp), -1);
  if (cuda) {
    RECALL_ASSIGN_OR_RETURN(devices, RankDevices(options));
  }
  kernels::InProcessGroupOptions comm_options;
  comm_options.timeout = options.collective_timeout;
  RECALL_ASSIGN_OR_RETURN(std::vector<std::unique_ptr<kernels::Communicator>> comms,
                          kernels::CreateInProcessGroup(options.tp, comm_options));
  std::unique_ptr<TpGroup> group(new TpGroup(full));
  for (int r = 0; r < options.tp; ++r) {
    RECALL_ASSIGN_OR_RETURN(std::unique_ptr<Rank> rank,
                            CreateRank(full, options, r, devices[static_cast<size_t>(r)]));
    rank->comm = std::move(comms[static_cast<size_t>(r)]);
    group->ranks_.push_back(std::move(rank));
  }
  RECALL_RETURN_IF_ERROR(group->CreatePools(options));
  if ((cuda || options.opaque_cpu_memory) && options.tp > 1) {
    RECALL_RETURN_IF_ERROR(group->ConnectDeviceRanks(options));
  }
  for (auto& rank : group->ranks_) {
    ForwardOptions fo = options.forward;
    if (options.tp > 1) {
      fo.comm = rank->device_comm != nullptr ? rank->device_comm.get() : rank->comm.get();
      fo.host_comm = rank->comm.get();
    }
    if (rank->cuda_device >= 0) RECALL_RETURN_IF_ERROR(kernels::CudaBindThread(rank->cuda_device));
    rank->forward = std::make_unique<ForwardPass>(*rank->model, *rank->backend, fo);
  }
  if (cuda) RECALL_RETURN_IF_ERROR(kernels::CudaBindThread(devices[0]));
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
  // A CUDA rank's thread queues its ops on its own device (checked at creation).
  if (ranks_[rank]->cuda_device >= 0) (void)kernels::CudaBindThread(ranks_[rank]->cuda_device);
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
  absl::Status mine = ranks_[0]->cuda_device >= 0 ? kernels::CudaBindThread(ranks_[0]->cuda_device)
                                                  : absl::OkStatus();
  if (mine.ok()) mine = fn(0);
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

}  // namespace recall::runtime::tp
