#include "worker/runtime/device.h"

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

}  // namespace recall::runtime
