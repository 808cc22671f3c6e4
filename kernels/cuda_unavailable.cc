// CreateCudaBackend in builds without CUDA (RECALL_WITH_CUDA off).
#include "kernels/cuda_backend.h"

namespace recall::kernels {

absl::StatusOr<std::unique_ptr<Backend>> CreateCudaBackend(const CudaBackendOptions&) {
  return absl::UnimplementedError(
      "device cuda: this build has no CUDA backend (configure with -DRECALL_WITH_CUDA=ON on a "
      "machine with the CUDA toolkit)");
}

int CudaDeviceCount() { return 0; }

absl::StatusOr<int64_t> CudaFreeMemory(int) {
  return absl::UnimplementedError("device cuda: this build has no CUDA backend");
}

void* CudaStreamOf(Backend&) { return nullptr; }

std::string CudaOpTimes(Backend&, bool) { return ""; }

bool CudaPicksOnHost(Backend&) { return false; }

bool CudaEvictsOnHost(Backend&) { return false; }

bool CudaRerotatesOnHost(Backend&) { return false; }

bool CudaMatMulsOnCublas(Backend&) { return false; }
bool CudaFp8OnCublasLt(Backend&) { return false; }

absl::Status CudaBindThread(int) {
  return absl::UnimplementedError("device cuda: this build has no CUDA backend");
}

}  // namespace recall::kernels
