// CreateNcclGroup for builds without NCCL (RECALL_WITH_NCCL off or no CUDA toolkit).
#include "kernels/comm/communicator.h"

namespace recall::kernels {

absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> CreateNcclGroup(
    const std::vector<int>& devices, const std::vector<void*>& streams) {
  return absl::UnimplementedError(
      "NCCL communicator: this build has no NCCL (configure with RECALL_WITH_NCCL=ON and the "
      "CUDA toolkit); CPU ranks use the in-process communicator");
}

}  // namespace recall::kernels
