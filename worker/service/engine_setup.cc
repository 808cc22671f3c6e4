#include "worker/service/engine_setup.h"

#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/cuda_backend.h"
#include "worker/model/upload.h"
#include "worker/serving/tp_ranks.h"

namespace recall::service {
namespace {

// The available physical memory from /proc/meminfo (0 if unknown).
int64_t AvailableMemoryBytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kb;
  std::string unit;
  while (in >> key >> kb >> unit) {
    if (key == "MemAvailable:") return kb * 1024;
  }
  return 0;
}

// The KV bytes of all ranks together.
absl::StatusOr<int64_t> KvBytes(const EngineFlags& flags, int first_device) {
  if (flags.kv_bytes.has_value()) return *flags.kv_bytes;
  int64_t base = AvailableMemoryBytes();
  if (flags.device == "cuda") {
    RECALL_ASSIGN_OR_RETURN(base, kernels::CudaFreeMemory(first_device));
  }
  if (base <= 0) {
    return absl::FailedPreconditionError(
        "--kv-cache-fraction: the available memory is unknown; give --kv-cache-bytes");
  }
  return static_cast<int64_t>(flags.kv_fraction * static_cast<double>(base));
}

absl::Status CheckRankBytes(int64_t per_rank, const kernels::PagedKvLayout& layout) {
  const int64_t block_bytes = layout.BlockFloats() * static_cast<int64_t>(sizeof(float));
  if (per_rank < block_bytes * layout.n_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--kv-cache-bytes: ", per_rank, " bytes per rank is less than one KV block per layer (",
        layout.n_layers, " x ", block_bytes, " bytes)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Engine> BuildEngine(const model::Model& model, const model::Tokenizer& tokenizer,
                                   const EngineFlags& flags,
                                   const serving::SchedulerOptions& options,
                                   metrics::Registry* registry) {
  RECALL_RETURN_IF_ERROR(
      runtime::tp::CheckDeviceFlags(flags.device, flags.tp, flags.devices, flags.tp_comm));
  const model::ModelConfig& c = model.config;
  Engine e;
  if (flags.tp > 1) {
    runtime::tp::TpGroupOptions g;
    g.tp = flags.tp;
    g.device = flags.device;
    g.devices = flags.devices;
    g.collectives = flags.tp_comm;
    g.threads_per_rank = flags.threads > 0 ? std::max(1, flags.threads / flags.tp) : 0;
    RECALL_ASSIGN_OR_RETURN(runtime::tp::TpLayout rank_layout,
                            runtime::tp::MakeTpLayout(c, flags.tp, 0));
    const kernels::PagedKvLayout rank_kv{c.n_layers, rank_layout.kv_heads, c.head_dim,
                                         g.block_tokens};
    if (flags.device == "cuda" && !flags.kv_bytes.has_value()) {
      g.kv_fraction = flags.kv_fraction;  // of each GPU's free memory after the weights
    } else {
      RECALL_ASSIGN_OR_RETURN(const int64_t total, KvBytes(flags, 0));
      g.kv_bytes_per_rank = total / flags.tp;
      RECALL_RETURN_IF_ERROR(CheckRankBytes(g.kv_bytes_per_rank, rank_kv));
    }
    g.forward.max_batch_tokens = options.max_batch_tokens;
    g.forward.batch_invariant = options.batch_invariant;
    absl::StatusOr<std::unique_ptr<runtime::tp::TpGroup>> group =
        runtime::tp::TpGroup::Create(model, g);
    if (!group.ok() && absl::StartsWith(group.status().message(), "kv_fraction")) {
      return absl::InvalidArgumentError(
          absl::StrCat("--kv-cache-fraction: ", flags.kv_fraction, " of the GPUs' free memory "
                       "is less than one KV block per layer on a rank (",
                       group.status().message(), "); give more, or --kv-cache-bytes"));
    }
    if (!group.ok()) return runtime::tp::WithFlagNames(group.status());
    e.group = *std::move(group);
    RECALL_ASSIGN_OR_RETURN(e.scheduler,
                            serving::Scheduler::Create(model, serving::SchedulerRanksOf(*e.group),
                                                       tokenizer, options, registry));
    e.kv_blocks = e.group->pool(0).num_blocks();
    for (int r = 0; r < flags.tp; ++r) {
      e.kv_bytes += e.group->pool(r).num_blocks() * e.group->pool(r).block_bytes();
    }
    std::string where = flags.device;
    if (flags.device == "cuda") {
      for (int r = 0; r < flags.tp; ++r) {
        absl::StrAppend(&where, r == 0 ? " " : ",", e.group->cuda_device(r));
      }
      absl::StrAppend(&where, ", ", e.group->collectives());
    }
    e.summary = absl::StrCat("tp ", flags.tp, " (", where, " ranks); KV pool ", e.kv_blocks,
                             " blocks of ", e.group->pool(0).block_bytes(), " bytes per rank");
    return e;
  }
  const int device = flags.devices.empty() ? 0 : flags.devices[0];
  const model::Model* weights = &model;
  if (flags.device == "cuda") {
    RECALL_ASSIGN_OR_RETURN(e.backend, kernels::CreateCudaBackend({device}));
    RECALL_ASSIGN_OR_RETURN(e.uploaded, model::UploadModel(model, e.backend->memory()));
    weights = e.uploaded.get();
  } else {
    e.backend = kernels::CreateCpuBackend({flags.threads});
  }
  RECALL_ASSIGN_OR_RETURN(e.kv_bytes, KvBytes(flags, device));
  const kernels::PagedKvLayout layout{c.n_layers, c.n_kv_heads, c.head_dim, 16};
  RECALL_RETURN_IF_ERROR(CheckRankBytes(e.kv_bytes, layout));
  RECALL_ASSIGN_OR_RETURN(e.pool,
                          cache::BlockPool::CreateWithBytes(layout, e.kv_bytes, e.backend->memory()));
  RECALL_ASSIGN_OR_RETURN(e.scheduler, serving::Scheduler::Create(*weights, *e.backend, *e.pool,
                                                                  tokenizer, options, registry));
  e.kv_blocks = e.pool->num_blocks();
  e.summary = absl::StrCat(flags.device, flags.device == "cuda" ? absl::StrCat(" ", device) : "",
                           "; KV pool ", e.kv_blocks, " blocks of ", e.pool->block_bytes(),
                           " bytes (", e.kv_blocks * e.pool->block_bytes() / 1048576.0, " MiB)");
  return e;
}

}  // namespace recall::service
