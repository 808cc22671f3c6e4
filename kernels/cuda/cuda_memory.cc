#include "kernels/cuda/cuda_memory.h"

#include "absl/strings/str_cat.h"
#include "common/cuda/cuda_status.h"
#include "common/logging.h"
#include "common/status.h"
#include "kernels/cuda/launch.h"

namespace recall::kernels::cuda {

CudaMemory::~CudaMemory() = default;

bool CudaMemory::Check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return true;
  absl::MutexLock lock(&mu_);
  absl::Status& kept = recording_ ? recording_error_ : first_error_;
  if (kept.ok()) kept = recall::cuda::CudaStatus(err, what);
  return false;
}

absl::Status CudaMemory::status() const {
  absl::MutexLock lock(&mu_);
  return first_error_;
}

absl::StatusOr<void*> CudaMemory::Allocate(size_t bytes) {
  if (Refuse("an allocation")) {
    return absl::FailedPreconditionError("cuda device: cannot allocate while recording a graph");
  }
  cudaSetDevice(device_);
  absl::StatusOr<void*> p = recall::cuda::DeviceAlloc(bytes);
  if (!p.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat("cuda device ", device_, ": cannot allocate ",
                                                     bytes, " bytes (", p.status().message(), ")"));
  }
  return *p;
}

void CudaMemory::Free(void* p) {
  const absl::Status st = recall::cuda::DeviceFree(p);
  if (!st.ok()) {
    absl::MutexLock lock(&mu_);
    if (first_error_.ok()) first_error_ = st;
  }
}

void CudaMemory::CopyIn(void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || Refuse("a copy from the host")) return;
  Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync H2D");
  Check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize after H2D");
}

void CudaMemory::CopyOut(void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || Refuse("a copy to the host")) return;
  Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync D2H");
  Check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize after D2H");
}

void CudaMemory::Copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  Check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_), "cudaMemcpyAsync D2D");
}

void CudaMemory::CopyOutRows(void* dst, size_t dst_stride, const void* src, size_t src_stride,
                             size_t row_bytes, size_t rows) {
  if (rows == 0 || row_bytes == 0 || Refuse("a copy of rows to the host")) return;
  Check(cudaMemcpy2DAsync(dst, dst_stride, src, src_stride, row_bytes, rows,
                          cudaMemcpyDeviceToHost, stream_),
        "cudaMemcpy2DAsync D2H");
  Check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize after D2H rows");
}

bool CudaMemory::GrowScratch(recall::cuda::DeviceBuffer& buffer, size_t bytes, const char* what) {
  if (bytes <= buffer.bytes()) return true;
  buffer = recall::cuda::DeviceBuffer();  // free the old one first
  absl::StatusOr<recall::cuda::DeviceBuffer> grown =
      recall::cuda::DeviceBuffer::Allocate(bytes * 2);
  if (!grown.ok()) {
    absl::MutexLock lock(&mu_);
    if (first_error_.ok()) first_error_ = Annotate(grown.status(), what);
    return false;
  }
  buffer = *std::move(grown);
  return true;
}

void CudaMemory::CompactRows(const PagedKvHead& rows, const int32_t* keep, int n) {
  moves_.clear();
  const uint8_t* base = rows.base;
  const bool scaled = rows.dtype == KvDType::kInt8;
  for (int i = 0; i < n; ++i) {
    if (keep[i] == i) continue;
    RowMove mv;
    mv.src_row = rows.RowData(0, keep[i]) - base;
    mv.dst_row = rows.RowData(0, i) - base;
    if (scaled) {
      mv.src_scale = reinterpret_cast<const uint8_t*>(rows.RowScale(0, keep[i])) - base;
      mv.dst_scale = reinterpret_cast<const uint8_t*>(rows.RowScale(0, i)) - base;
    }
    moves_.push_back(mv);
  }
  const int m = static_cast<int>(moves_.size());
  if (m == 0 || Refuse("cache compaction")) return;
  // Its allocations and launch go to the current device: make it this memory's (the caller
  // may be a thread bound to another GPU).
  if (!Check(cudaSetDevice(device_), "cudaSetDevice before compaction")) return;
  const size_t pair_bytes = moves_.size() * sizeof(RowMove);
  const size_t row_bytes = static_cast<size_t>(m) * (2 * rows.row_bytes() + 8);
  // The buffers are reused by the next call: wait until the previous moves are done.
  if (!Check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize before compaction")) return;
  if (!GrowScratch(d_pairs_, pair_bytes, "compaction list") ||
      !GrowScratch(d_rows_, row_bytes, "compaction rows")) {
    return;
  }
  Check(cudaMemcpyAsync(d_pairs_.get(), moves_.data(), pair_bytes, cudaMemcpyHostToDevice, stream_),
        "cudaMemcpyAsync (compaction list)");
  const PagedKvLayout layout{0, 1, rows.head_dim, rows.block_tokens, rows.dtype};
  LaunchMoveRows(rows.base, d_pairs_.as<const RowMove>(), m, layout, d_rows_.as<uint32_t>(),
                 stream_);
  Check(cudaGetLastError(), "compaction kernels");
  // moves_ (pageable host memory) was consumed by the copy before cudaMemcpyAsync returned.
}

}  // namespace recall::kernels::cuda
