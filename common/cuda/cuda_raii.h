// Move-only owners of CUDA resources. Only common/cuda creates or frees device memory,
// streams and events; everything else holds these types. Header-only; compiled only when
// RECALL_WITH_CUDA is on. Creation returns StatusOr (out of memory is a Status, not a crash).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <utility>

#include "absl/status/statusor.h"
#include "common/cuda/cuda_status.h"

namespace recall::cuda {

// Device memory from cudaMalloc, freed on destruction.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  static absl::StatusOr<DeviceBuffer> Allocate(size_t bytes) {
    DeviceBuffer buffer;
    if (bytes == 0) return buffer;
    RECALL_CUDA_RETURN_IF_ERROR(cudaMalloc(&buffer.ptr_, bytes));
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

// A non-blocking CUDA stream.
class Stream {
 public:
  Stream() = default;
  static absl::StatusOr<Stream> Create() {
    Stream stream;
    RECALL_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream.stream_, cudaStreamNonBlocking));
    return stream;
  }
  Stream(Stream&& other) noexcept : stream_(std::exchange(other.stream_, nullptr)) {}
  Stream& operator=(Stream&& other) noexcept {
    if (this != &other) {
      Reset();
      stream_ = std::exchange(other.stream_, nullptr);
    }
    return *this;
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream() { Reset(); }

  cudaStream_t get() const { return stream_; }
  absl::Status Synchronize() const {
    return CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  }

 private:
  void Reset() {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    stream_ = nullptr;
  }
  cudaStream_t stream_ = nullptr;
};

// A CUDA event (timing enabled), e.g. for kernel timings in benchmarks.
class Event {
 public:
  Event() = default;
  static absl::StatusOr<Event> Create() {
    Event event;
    RECALL_CUDA_RETURN_IF_ERROR(cudaEventCreate(&event.event_));
    return event;
  }
  Event(Event&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}
  Event& operator=(Event&& other) noexcept {
    if (this != &other) {
      Reset();
      event_ = std::exchange(other.event_, nullptr);
    }
    return *this;
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event() { Reset(); }

  cudaEvent_t get() const { return event_; }

 private:
  void Reset() {
    if (event_ != nullptr) cudaEventDestroy(event_);
    event_ = nullptr;
  }
  cudaEvent_t event_ = nullptr;
};

}  // namespace recall::cuda
