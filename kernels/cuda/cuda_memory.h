// CudaMemory: device memory of one GPU as a kernels::Memory, ordered on the backend's stream.
// Copies to and from the host synchronize the stream (so they see every op queued before);
// device-to-device copies and row compaction are queued on it. The first CUDA error is kept
// and reported by status(). While the backend records a graph (Backend::Record), the copies
// that cross to the host and compaction are refused instead of run (they cannot be captured).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/cuda/cuda_raii.h"
#include "kernels/cuda/launch.h"
#include "kernels/memory.h"

namespace recall::kernels::cuda {

class CudaMemory final : public Memory {
 public:
  CudaMemory(int device, cudaStream_t stream) : device_(device), stream_(stream) {}
  ~CudaMemory() override;

  const char* Name() const override { return "cuda device"; }
  bool host_accessible() const override { return false; }
  absl::StatusOr<void*> Allocate(size_t bytes) override;
  void Free(void* p) override;
  void CopyIn(void* dst, const void* host_src, size_t bytes) override;
  void CopyOut(void* host_dst, const void* src, size_t bytes) override;
  void Copy(void* dst, const void* src, size_t bytes) override;
  void CopyOutRows(void* host_dst, size_t dst_stride, const void* src, size_t src_stride,
                   size_t row_bytes, size_t rows) override;
  void CompactRows(const PagedKvHead& rows, const int32_t* keep, int n) override;

  // Records `err` (the first error wins); returns whether it was a success. While recording,
  // the error is the recording's (TakeRecordingError), not the device's: a launch that cannot
  // be captured turns graphs off, and the direct run after it says whether the device works.
  bool Check(cudaError_t err, const char* what);
  // The first error seen, or ok.
  absl::Status status() const;
  cudaStream_t stream() const { return stream_; }

  // Recording: between the two calls, Refuse(what) answers true (and remembers the first
  // `what`) for an op that cannot be captured in a graph; EndRecording returns that op, or
  // null when every op could be.
  void BeginRecording() {
    recording_ = true;
    refused_ = nullptr;
  }
  const char* EndRecording() {
    recording_ = false;
    return refused_;
  }
  // The first error Check saw while recording, cleared.
  absl::Status TakeRecordingError() {
    absl::MutexLock lock(&mu_);
    return std::exchange(recording_error_, absl::OkStatus());
  }
  bool Refuse(const char* what) {
    if (!recording_) return false;
    if (refused_ == nullptr) refused_ = what;
    return true;
  }
  int device() const { return device_; }

 private:
  int device_;
  cudaStream_t stream_;
  mutable absl::Mutex mu_;
  absl::Status first_error_ ABSL_GUARDED_BY(mu_);
  absl::Status recording_error_ ABSL_GUARDED_BY(mu_);
  bool recording_ = false;
  const char* refused_ = nullptr;
  // Makes `buffer` hold at least `bytes` (twice that, to grow rarely); false (the error kept)
  // when it cannot.
  bool GrowScratch(recall::cuda::DeviceBuffer& buffer, size_t bytes, const char* what);

  // CompactRows' move list (host, then device) and row scratch; grow once.
  std::vector<RowMove> moves_;
  recall::cuda::DeviceBuffer d_pairs_;
  recall::cuda::DeviceBuffer d_rows_;
};

}  // namespace recall::kernels::cuda
