#include "worker/runtime/engine.h"

#include "absl/strings/str_cat.h"
#include "common/flags.h"
#include "common/status.h"
#include "common/system_memory.h"
#include "kernels/cuda_backend.h"
#include "worker/model/upload.h"

namespace recall::runtime {
namespace {

int64_t BlockBytes(const model::ModelConfig& c, int kv_heads, int block_tokens,
                   kernels::KvDType dtype) {
  const kernels::PagedKvLayout layout{c.n_layers, kv_heads, c.head_dim, block_tokens, dtype};
  return layout.BlockBytes();
}

}  // namespace

absl::Status EngineOptions::Validate() const {
  if (tp < 1 || tp > 64) return flags::FieldError("tp", absl::StrCat(tp, " must be in [1, 64]"));
  if (threads < 0) return flags::FieldError("threads", absl::StrCat(threads, " must be >= 0"));
  if (device != Device::kCuda && !devices.empty()) {
    return flags::FieldError("devices", "only with {device} cuda");
  }
  if (!devices.empty() && static_cast<int>(devices.size()) != tp) {
    return flags::FieldError(
        "devices", absl::StrCat(devices.size(), " devices for {tp} ", tp, "; give one per rank"));
  }
  for (int d : devices) {
    if (d < 0) return flags::FieldError("devices", absl::StrCat("ordinal ", d, " must be >= 0"));
  }
  if (device != Device::kCuda && tp_comm.has_value()) {
    return flags::FieldError("tp_comm", "only with {device} cuda");
  }
  if (kv_cache_bytes.has_value() && *kv_cache_bytes < 1) {
    return flags::FieldError("kv_cache_bytes", absl::StrCat(*kv_cache_bytes, " must be >= 1"));
  }
  if (!(kv_cache_fraction > 0 && kv_cache_fraction <= 0.95)) {
    return flags::FieldError("kv_cache_fraction",
                             absl::StrCat(kv_cache_fraction, " must be in (0, 0.95]"));
  }
  if (block_tokens < 1) {
    return flags::FieldError("block_tokens", absl::StrCat(block_tokens, " must be >= 1"));
  }
  return absl::OkStatus();
}

int64_t KvBytesFor(const model::ModelConfig& c, int tokens, int block_tokens,
                   kernels::KvDType dtype) {
  const int64_t blocks = (tokens + block_tokens - 1) / block_tokens;
  return blocks * c.n_layers * BlockBytes(c, c.n_kv_heads, block_tokens, dtype);
}

int64_t FullContextKvBytes(const model::ModelConfig& c, int block_tokens, kernels::KvDType dtype) {
  return KvBytesFor(c, c.max_seq_len, block_tokens, dtype);
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const model::Model& model,
                                                       const EngineOptions& options) {
  RECALL_RETURN_IF_ERROR(options.Validate());
  std::unique_ptr<Engine> e(new Engine(model, options));
  RECALL_RETURN_IF_ERROR(options.tp > 1 ? e->CreateGroup() : e->CreateOneRank());
  return e;
}

Engine::~Engine() = default;

absl::Status Engine::CreateOneRank() {
  const EngineOptions& o = options_;
  const model::ModelConfig& c = model_.config;
  const int device = o.devices.empty() ? 0 : o.devices[0];
  RECALL_ASSIGN_OR_RETURN(backend_, MakeBackend({.device = o.device,
                                                 .cuda_device = device,
                                                 .cpu_threads = o.threads,
                                                 .opaque_cpu_memory = o.opaque_cpu_memory}));
  RECALL_RETURN_IF_ERROR(CheckBackendRunsWeights(c.weight_dtype, *backend_, "this device"));
  const model::Model* weights = &model_;
  if (o.device == Device::kCuda) {
    RECALL_ASSIGN_OR_RETURN(uploaded_, model::UploadModel(model_, backend_->memory()));
    weights = uploaded_.get();
  }
  int64_t bytes = 0;
  const char* field = "kv_cache_bytes";
  if (o.kv_cache_bytes.has_value()) {
    bytes = *o.kv_cache_bytes;
  } else {
    field = "kv_cache_fraction";
    int64_t base = AvailableMemoryBytes();
    if (o.device == Device::kCuda) {
      RECALL_ASSIGN_OR_RETURN(base, kernels::CudaFreeMemory(device));
    }
    if (base <= 0) {
      return flags::FieldError("kv_cache_fraction",
                               "the available memory is unknown; give {kv_cache_bytes}",
                               absl::StatusCode::kFailedPrecondition);
    }
    bytes = static_cast<int64_t>(o.kv_cache_fraction * static_cast<double>(base));
  }
  const int64_t per_layer = BlockBytes(c, c.n_kv_heads, o.block_tokens, o.kv_dtype) * c.n_layers;
  if (bytes < per_layer) {
    return flags::FieldError(field,
                             absl::StrCat(bytes,
                                          " bytes is less than one KV block per "
                                          "layer (",
                                          c.n_layers, " x ", per_layer / c.n_layers, " bytes)"));
  }
  const kernels::PagedKvLayout layout{c.n_layers, c.n_kv_heads, c.head_dim, o.block_tokens,
                                      o.kv_dtype};
  RECALL_ASSIGN_OR_RETURN(pool_,
                          cache::BlockPool::CreateWithBytes(layout, bytes, backend_->memory()));
  forward_ = std::make_unique<ForwardPass>(*weights, *backend_, o.forward);
  kv_bytes_ = pool_->num_blocks() * pool_->block_bytes();
  return absl::OkStatus();
}

absl::Status Engine::CreateGroup() {
  const EngineOptions& o = options_;
  tp::TpGroupOptions g;
  g.tp = o.tp;
  g.device = o.device;
  g.devices = o.devices;
  g.tp_comm = o.tp_comm;
  g.threads_per_rank = o.threads > 0 ? std::max(1, o.threads / o.tp) : 0;
  g.opaque_cpu_memory = o.opaque_cpu_memory;
  g.block_tokens = o.block_tokens;
  g.kv_dtype = o.kv_dtype;
  g.forward = o.forward;
  if (o.device == Device::kCuda && !o.kv_cache_bytes.has_value()) {
    g.kv_cache_fraction = o.kv_cache_fraction;  // of each GPU's free memory after the weights
  } else if (o.kv_cache_bytes.has_value()) {
    g.kv_bytes_per_rank = *o.kv_cache_bytes / o.tp;
  } else {
    const int64_t base = AvailableMemoryBytes();
    if (base <= 0) {
      return flags::FieldError("kv_cache_fraction",
                               "the available memory is unknown; give {kv_cache_bytes}",
                               absl::StatusCode::kFailedPrecondition);
    }
    g.kv_bytes_per_rank =
        static_cast<int64_t>(o.kv_cache_fraction * static_cast<double>(base)) / o.tp;
  }
  RECALL_ASSIGN_OR_RETURN(group_, tp::TpGroup::Create(model_, g));
  for (int r = 0; r < o.tp; ++r)
    kv_bytes_ += group_->pool(r).num_blocks() * group_->pool(r).block_bytes();
  return absl::OkStatus();
}

kernels::Backend& Engine::backend(int r) { return group_ ? group_->backend(r) : *backend_; }

const model::Model& Engine::weights(int r) {
  if (group_) return group_->shard(r);
  return uploaded_ ? *uploaded_ : model_;
}

cache::BlockPool& Engine::pool(int r) { return group_ ? group_->pool(r) : *pool_; }

ForwardPass& Engine::forward(int r) { return group_ ? group_->forward(r) : *forward_; }

kernels::Communicator* Engine::comm(int r) { return group_ ? &group_->comm(r) : nullptr; }

int Engine::kv_head_offset(int r) { return group_ ? group_->layout(r).kv_head_offset : 0; }

absl::Status Engine::RunAll(const std::function<absl::Status(int)>& fn) {
  return group_ ? group_->Run(fn) : fn(0);
}

std::string Engine::Summary() const {
  const cache::BlockPool& p = group_ ? group_->pool(0) : *pool_;
  std::string where = DeviceName(options_.device);
  const std::string weights = model_.config.WeightsName();
  if (group_) {
    if (options_.device == Device::kCuda) {
      for (int r = 0; r < options_.tp; ++r)
        absl::StrAppend(&where, r == 0 ? " " : ",", group_->cuda_device(r));
      absl::StrAppend(&where, ", ", group_->collectives());
    }
    return absl::StrCat("tp ", options_.tp, " (", where, " ranks); ", weights, " weights; ",
                        kernels::KvDTypeName(options_.kv_dtype), " KV pool ", p.num_blocks(),
                        " blocks of ", p.block_bytes(), " bytes per rank");
  }
  if (options_.device == Device::kCuda) {
    absl::StrAppend(&where, " ", options_.devices.empty() ? 0 : options_.devices[0]);
  }
  return absl::StrCat(where, "; ", weights, " weights; ", kernels::KvDTypeName(options_.kv_dtype),
                      " KV pool ", p.num_blocks(), " blocks of ", p.block_bytes(), " bytes (",
                      kv_bytes_ / 1048576.0, " MiB)");
}

}  // namespace recall::runtime
