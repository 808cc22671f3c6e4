// Where a model runs: the device kind, how CUDA ranks carry their all-reduces, and the one
// function that makes a rank's backend (CPU or CUDA).
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/backend.h"

namespace recall::runtime {

enum class Device { kCpu, kCuda };
const char* DeviceName(Device device);  // "cpu", "cuda"

// How CUDA ranks all-reduce activations: NCCL (one distinct GPU per rank) or staged through
// host memory (slower; ranks may share a GPU).
enum class TpComm { kNccl, kStaged };
const char* TpCommName(TpComm comm);  // "nccl", "staged"

struct BackendSpec {
  Device device = Device::kCpu;
  int cuda_device = 0;  // CUDA ordinal
  int cpu_threads = 0;  // CPU threads (0: every core)
  // Testing, CPU: memory the host treats as device memory (kernels::CpuBackendOptions).
  bool opaque_cpu_memory = false;
};

// A backend for one rank. CUDA: the CUDA backend's error (Unimplemented in builds without
// CUDA, FailedPrecondition without a GPU or for an ordinal that does not exist).
absl::StatusOr<std::unique_ptr<kernels::Backend>> MakeBackend(const BackendSpec& spec);

}  // namespace recall::runtime
