// Where a model runs: the device kind, how CUDA ranks carry their all-reduces, and the one
// function that makes a rank's backend (CPU or CUDA).
#pragma once

#include <memory>
#include <string>

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

// InvalidArgument naming weight_dtype when `backend` does not multiply matrices of
// `weight_dtype`: int8 on a device whose int8 kernels failed their start-up check, FP8 on a
// CPU or on a device whose FP8 kernel failed its check. `who`: "this device", "rank 1", ...
absl::Status CheckBackendRunsWeights(kernels::DType weight_dtype, const kernels::Backend& backend,
                                     const std::string& who);

}  // namespace recall::runtime
