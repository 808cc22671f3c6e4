// Move-only owners of CUDA resources. Only common/cuda creates or frees device memory,
// streams, events and graphs; everything else holds these types. Header-only; compiled only when
// RECALL_WITH_CUDA is on. Creation returns StatusOr (out of memory is a Status, not a crash).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>

#include "absl/status/statusor.h"
#include "common/cuda/cuda_status.h"

namespace recall::cuda {

// Raw device memory for owners that keep their own bookkeeping (kernels::Memory hands out
// void*): on the current device, 256-byte aligned. An out-of-memory answer is
// ResourceExhausted and is cleared (not sticky).
inline absl::StatusOr<void*> DeviceAlloc(size_t bytes) {
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes == 0 ? 256 : bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return CudaStatus(err, "cudaMalloc");
  }
  return p;
}
inline absl::Status DeviceFree(void* p) {
  return p == nullptr ? absl::OkStatus() : CudaStatus(cudaFree(p), "cudaFree");
}

// Device memory from cudaMalloc, freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  static absl::StatusOr<DeviceBuffer> Allocate(size_t bytes) {
    DeviceBuffer buffer;
    if (bytes == 0) return buffer;
    if (const cudaError_t err = cudaMalloc(&buffer.ptr_, bytes); err != cudaSuccess) {
      cudaGetLastError();  // not sticky: a later launch check must not see it
      buffer.ptr_ = nullptr;
      return CudaStatus(err, "cudaMalloc");
    }
    buffer.bytes_ = bytes;
    return buffer;
  }
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : ptr_(std::exchange(other.ptr_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      Reset();
      ptr_ = std::exchange(other.ptr_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { Reset(); }

  void* get() const { return ptr_; }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }

 private:
  void Reset() {
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Owns one CUDA handle, released by `Destroy` (streams, events, graphs).
template <typename T, cudaError_t (*Destroy)(T)>
class Owned {
 public:
  Owned() = default;
  explicit Owned(T handle) : handle_(handle) {}
  Owned(Owned&& other) noexcept : handle_(std::exchange(other.handle_, nullptr)) {}
  Owned& operator=(Owned&& other) noexcept {
    if (this != &other) {
      Reset();
      handle_ = std::exchange(other.handle_, nullptr);
    }
    return *this;
  }
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  ~Owned() { Reset(); }

  T get() const { return handle_; }

 private:
  void Reset() {
    if (handle_ != nullptr) Destroy(handle_);
    handle_ = nullptr;
  }
  T handle_ = nullptr;
};

// A non-blocking CUDA stream.
class Stream : public Owned<cudaStream_t, cudaStreamDestroy> {
 public:
  using Owned::Owned;
  static absl::StatusOr<Stream> Create() {
    cudaStream_t stream = nullptr;
    RECALL_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    return Stream(stream);
  }
  absl::Status Synchronize() const {
    return CudaStatus(cudaStreamSynchronize(get()), "cudaStreamSynchronize");
  }
};

// A CUDA event (timing enabled), e.g. for kernel timings in benchmarks.
class Event : public Owned<cudaEvent_t, cudaEventDestroy> {
 public:
  using Owned::Owned;
  static absl::StatusOr<Event> Create() {
    cudaEvent_t event = nullptr;
    RECALL_CUDA_RETURN_IF_ERROR(cudaEventCreate(&event));
    return Event(event);
  }
};

// A captured CUDA graph (cudaStreamEndCapture's), and an executable one instantiated from it.
using Graph = Owned<cudaGraph_t, cudaGraphDestroy>;
class GraphExec : public Owned<cudaGraphExec_t, cudaGraphExecDestroy> {
 public:
  using Owned::Owned;
  static absl::StatusOr<GraphExec> Instantiate(cudaGraph_t graph) {
    cudaGraphExec_t exec = nullptr;
    RECALL_CUDA_RETURN_IF_ERROR(cudaGraphInstantiate(&exec, graph, 0));
    return GraphExec(exec);
  }
};

}  // namespace recall::cuda
