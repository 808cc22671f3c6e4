#include "worker/runtime/device.h"

#include "absl/strings/str_cat.h"
#include "common/flags.h"
#include "kernels/cuda_backend.h"

namespace recall::runtime {

const char* DeviceName(Device device) { return device == Device::kCuda ? "cuda" : "cpu"; }

const char* TpCommName(TpComm comm) { return comm == TpComm::kStaged ? "staged" : "nccl"; }

absl::StatusOr<std::unique_ptr<kernels::Backend>> MakeBackend(const BackendSpec& spec) {
  if (spec.device == Device::kCuda) {
    kernels::CudaBackendOptions o;
    o.device = spec.cuda_device;
    return kernels::CreateCudaBackend(o);
  }
  kernels::CpuBackendOptions o;
  o.num_threads = spec.cpu_threads;
  o.opaque_memory = spec.opaque_cpu_memory;
  return kernels::CreateCpuBackend(o);
}

absl::Status CheckBackendRunsWeights(kernels::DType weight_dtype, const kernels::Backend& backend,
                                     const std::string& who) {
  if (weight_dtype == kernels::DType::kI8 && !backend.RunsInt8Weights()) {
    return flags::FieldError("weight_dtype",
                             absl::StrCat("int8: ", who,
                                          "'s int8 kernels failed their start-up check (the log "
                                          "says how); load the weights as they are"));
  }
  if (weight_dtype == kernels::DType::kF8E4M3 && !backend.RunsFp8Weights()) {
    return flags::FieldError(
        "weight_dtype",
        absl::StrCat("fp8: ", who, " (", backend.Name(),
                     ") does not multiply FP8 weights (CUDA devices do, unless their FP8 "
                     "kernel failed its start-up check); use auto (widened to bf16) or int8"));
  }
  return absl::OkStatus();
}

}  // namespace recall::runtime
