// EngineSetup: what recall-worker serves with, built from its flags: one backend (CPU, or
// CUDA with the weights copied to the device) or a tensor-parallel group of ranks, the KV
// pool(s) and the scheduler over them.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cache/block_pool.h"
#include "common/metrics/registry.h"
#include "kernels/backend.h"
#include "worker/model/model.h"
#include "worker/runtime/tp/tp_group.h"
#include "worker/serving/scheduler.h"
#include "worker/tokenizer/tokenizer.h"

namespace recall::service {

struct EngineFlags {
  int tp = 1;                    // --tp
  std::string device = "cpu";    // --device: cpu or cuda
  std::vector<int> devices;      // --devices: CUDA ordinals, one per rank (default 0..tp-1)
  std::string tp_comm;           // --tp-comm: nccl (default) or staged; CUDA ranks only
  int threads = 0;               // --threads: CPU threads in all (0: every core)
  std::optional<int64_t> kv_bytes;  // --kv-cache-bytes: the KV pool over all ranks
  double kv_fraction = 0.25;     // --kv-cache-fraction: of available host (CPU) or free
                                 // device (CUDA) memory, when kv_bytes is unset
};

struct Engine {
  // Destroyed in reverse order: the scheduler before what it runs on.
  std::unique_ptr<kernels::Backend> backend;  // one rank
  std::unique_ptr<model::Model> uploaded;     // the weights in device memory (CUDA)
  std::unique_ptr<cache::BlockPool> pool;     // one rank
  std::unique_ptr<runtime::tp::TpGroup> group;  // tp > 1
  std::unique_ptr<serving::Scheduler> scheduler;
  int64_t kv_bytes = 0;  // the pool(s) in all
  int64_t kv_blocks = 0; // blocks per rank
  std::string summary;   // one line for the startup log
};

// InvalidArgument for flags that do not fit (--devices without cuda or not one per rank, a
// pool smaller than one block per layer on a rank, a tp the model's heads do not allow);
// the backend's error when a device is missing. `model` and `tokenizer` must outlive it.
absl::StatusOr<Engine> BuildEngine(const model::Model& model, const model::Tokenizer& tokenizer,
                                   const EngineFlags& flags,
                                   const serving::SchedulerOptions& options,
                                   metrics::Registry* registry);

}  // namespace recall::service
