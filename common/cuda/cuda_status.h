// CUDA error handling: one function turns cudaError_t into absl::Status, and a macro
// returns it from the calling function. Compiled only when RECALL_WITH_CUDA is on.
#pragma once

#include <cuda_runtime_api.h>

#include "absl/status/status.h"

namespace recall::cuda {

// Ok for cudaSuccess; otherwise Internal (or ResourceExhausted for out-of-memory) with the
// CUDA error name, its description and `what` (the call that failed).
absl::Status CudaStatus(cudaError_t err, const char* what);

}  // namespace recall::cuda

#define RECALL_CUDA_RETURN_IF_ERROR(call)                                          \
  do {                                                                             \
    ::absl::Status recall_cuda_status_ = ::recall::cuda::CudaStatus((call), #call); \
    if (!recall_cuda_status_.ok()) return recall_cuda_status_;                     \
  } while (0)
