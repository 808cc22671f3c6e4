// The NCCL Communicator (GPU ranks: one process, one thread per device, ncclCommInitAll).
// The only file that includes nccl.h. Every call is enqueued on the rank's stream (a borrowed
// one, such as the rank's backend stream, or one of its own) and synchronized before
// returning, so the blocking contract of Communicator holds.
#include <nccl.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "common/cuda/cuda_raii.h"
#include "common/cuda/cuda_status.h"
#include "kernels/comm/communicator.h"

namespace recall::kernels {
namespace {

// Ok for ncclSuccess; otherwise Internal (ResourceExhausted for a system error such as out of
// memory) with NCCL's error string and `what`.
absl::Status NcclStatus(ncclResult_t result, const char* what) {
  if (result == ncclSuccess) return absl::OkStatus();
  const std::string msg = absl::StrCat(what, ": ", ncclGetErrorString(result));
  return result == ncclSystemError ? absl::ResourceExhaustedError(msg) : absl::InternalError(msg);
}

#define RECALL_NCCL_RETURN_IF_ERROR(call)                           \
  do {                                                              \
    ::absl::Status recall_nccl_status_ = NcclStatus((call), #call); \
    if (!recall_nccl_status_.ok()) return recall_nccl_status_;      \
  } while (0)

ncclDataType_t ToNccl(CommDType t) {
  switch (t) {
    case CommDType::kF32: return ncclFloat32;
    case CommDType::kF64: return ncclFloat64;
    case CommDType::kI32: return ncclInt32;
    case CommDType::kI64: return ncclInt64;
    case CommDType::kU64: return ncclUint64;
  }
  return ncclFloat32;
}

ncclRedOp_t ToNccl(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kMax: return ncclMax;
    case ReduceOp::kMin: return ncclMin;
  }
  return ncclSum;
}

class NcclCommunicator final : public Communicator {
 public:
  // `borrowed` (may be null) is used instead of `owned` when given.
  NcclCommunicator(ncclComm_t comm, int device, int rank, int size, cuda::Stream owned,
                   cudaStream_t borrowed, cuda::DeviceBuffer barrier)
      : comm_(comm), device_(device), rank_(rank), size_(size), owned_(std::move(owned)),
        stream_(borrowed != nullptr ? borrowed : owned_.get()), barrier_(std::move(barrier)) {}
  ~NcclCommunicator() override {
    cudaSetDevice(device_);
    ncclCommDestroy(comm_);
  }

  const char* Name() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  absl::Status AllReduce(void* data, int64_t count, CommDType dtype, ReduceOp op) override {
    RECALL_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    RECALL_NCCL_RETURN_IF_ERROR(ncclAllReduce(data, data, static_cast<size_t>(count),
                                              ToNccl(dtype), ToNccl(op), comm_, stream_));
    return Synchronize();
  }

  absl::Status AllGather(const void* send, void* recv, int64_t count, CommDType dtype) override {
    RECALL_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    RECALL_NCCL_RETURN_IF_ERROR(ncclAllGather(send, recv, static_cast<size_t>(count),
                                              ToNccl(dtype), comm_, stream_));
    return Synchronize();
  }

  absl::Status Broadcast(void* data, int64_t count, CommDType dtype, int root) override {
    if (root < 0 || root >= size_) {
      return absl::InvalidArgumentError(
          absl::StrCat("Broadcast: root ", root, " outside [0, ", size_, ")"));
    }
    RECALL_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
    RECALL_NCCL_RETURN_IF_ERROR(ncclBroadcast(data, data, static_cast<size_t>(count),
                                              ToNccl(dtype), root, comm_, stream_));
    return Synchronize();
  }

  absl::Status Barrier() override {
    return AllReduce(barrier_.get(), 1, CommDType::kI32, ReduceOp::kSum);
  }

 private:
  absl::Status Synchronize() const {
    return cuda::CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize after NCCL");
  }

  ncclComm_t comm_;
  const int device_;
  const int rank_;
  const int size_;
  cuda::Stream owned_;   // empty when the stream is borrowed
  cudaStream_t stream_;  // where every call is queued
  cuda::DeviceBuffer barrier_;  // one int32 for Barrier()
};

}  // namespace

absl::StatusOr<std::vector<std::unique_ptr<Communicator>>> CreateNcclGroup(
    const std::vector<int>& devices, const std::vector<void*>& streams) {
  if (devices.empty()) return absl::InvalidArgumentError("NCCL group: no devices given");
  if (!streams.empty() && streams.size() != devices.size()) {
    return absl::InvalidArgumentError(absl::StrCat("NCCL group: ", streams.size(),
                                                   " streams for ", devices.size(),
                                                   " devices; give one per device or none"));
  }
  for (size_t i = 0; i < devices.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (devices[i] == devices[j]) {
        return absl::InvalidArgumentError(absl::StrCat(
            "NCCL group: device ", devices[i], " appears twice; NCCL needs one device per rank "
            "(ranks that share a GPU can use the staged group, CreateStagedGroup)"));
      }
    }
  }
  int visible = 0;
  RECALL_CUDA_RETURN_IF_ERROR(cudaGetDeviceCount(&visible));
  for (int d : devices) {
    if (d < 0 || d >= visible) {
      return absl::InvalidArgumentError(
          absl::StrCat("NCCL group: device ", d, " outside [0, ", visible, ")"));
    }
  }
  const int n = static_cast<int>(devices.size());
  std::vector<ncclComm_t> comms(static_cast<size_t>(n));
  RECALL_NCCL_RETURN_IF_ERROR(ncclCommInitAll(comms.data(), n, devices.data()));
  std::vector<std::unique_ptr<Communicator>> out;
  absl::Status failure;
  for (int r = 0; r < n; ++r) {
    if (failure.ok()) failure = cuda::CudaStatus(cudaSetDevice(devices[r]), "cudaSetDevice");
    cudaStream_t borrowed =
        streams.empty() ? nullptr : static_cast<cudaStream_t>(streams[static_cast<size_t>(r)]);
    absl::StatusOr<cuda::Stream> stream =
        !failure.ok()         ? absl::StatusOr<cuda::Stream>(failure)
        : borrowed != nullptr ? absl::StatusOr<cuda::Stream>(cuda::Stream())
                              : cuda::Stream::Create();
    absl::StatusOr<cuda::DeviceBuffer> barrier =
        stream.ok() ? cuda::DeviceBuffer::Allocate(sizeof(int32_t))
                    : absl::StatusOr<cuda::DeviceBuffer>(stream.status());
    if (!barrier.ok()) {
      if (failure.ok()) failure = barrier.status();
      ncclCommDestroy(comms[static_cast<size_t>(r)]);  // the rest are destroyed below
      continue;
    }
    out.push_back(std::make_unique<NcclCommunicator>(comms[static_cast<size_t>(r)], devices[r], r,
                                                     n, *std::move(stream), borrowed,
                                                     *std::move(barrier)));
  }
  if (!failure.ok()) return failure;  // `out` destroys the communicators it holds
  return out;
}

}  // namespace recall::kernels
