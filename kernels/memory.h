// Memory: where a backend's ops read and write ("backend memory"). Host memory for the CPU
// backend, device memory for the CUDA backend. The forward pass allocates its workspaces here,
// the block pool its KV blocks, and a model uploaded to a device its weights; everything that
// crosses between the host and backend memory goes through CopyIn / CopyOut.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>

#include "absl/status/statusor.h"
#include "kernels/tensor.h"

namespace recall::kernels {

class Memory {
 public:
  virtual ~Memory() = default;
  virtual const char* Name() const = 0;
  // True when the host may read and write this memory directly (host memory).
  virtual bool host_accessible() const = 0;

  // `bytes` of memory aligned to 64 bytes (at least one byte is allocated for bytes == 0);
  // ResourceExhausted, naming the size, when it cannot be had.
  virtual absl::StatusOr<void*> Allocate(size_t bytes) = 0;
  virtual void Free(void* p) = 0;
  // The contents of [p, p + bytes) (inside one allocation) are no longer needed until written
  // again: host memory gives the whole pages in it back to the system (they read as zeros
  // when next touched); device memory keeps them (the default does nothing).
  virtual void Discard(void* p, size_t bytes) {
    (void)p;
    (void)bytes;
  }

  // host -> this memory, this memory -> host, and within this memory. Complete on return
  // (device backends synchronize their stream).
  virtual void CopyIn(void* dst, const void* host_src, size_t bytes) = 0;
  virtual void CopyOut(void* host_dst, const void* src, size_t bytes) = 0;
  virtual void Copy(void* dst, const void* src, size_t bytes) = 0;
  // `rows` rows of `row_bytes` each from this memory (rows src_stride bytes apart) to the host
  // (rows dst_stride bytes apart).
  virtual void CopyOutRows(void* host_dst, size_t dst_stride, const void* src, size_t src_stride,
                           size_t row_bytes, size_t rows) = 0;

  // Compacts one (layer, KV head) of a paged cache: for i < n, the K and V rows of slot
  // keep[i] move to slot i. rows.base is in this memory; rows.block_table and keep are host
  // arrays. REQUIRES: keep strictly ascending (so keep[i] >= i).
  virtual void CompactRows(const PagedKvHead& rows, const int32_t* keep, int n) = 0;
};

// The process's host memory (64-byte aligned heap).
Memory& HostMemory();

// The same heap, but host_accessible() is false: for tests that run the device-memory code
// paths with the CPU backend (CpuBackendOptions::opaque_memory).
Memory& OpaqueHostMemory();

// Owns one allocation of a Memory.
class Buffer {
 public:
  Buffer() = default;
  static absl::StatusOr<Buffer> Allocate(Memory& memory, size_t bytes) {
    absl::StatusOr<void*> p = memory.Allocate(bytes);
    if (!p.ok()) return p.status();
    Buffer b;
    b.memory_ = &memory;
    b.ptr_ = *p;
    b.bytes_ = bytes;
    return b;
  }
  Buffer(Buffer&& o) noexcept
      : memory_(std::exchange(o.memory_, nullptr)), ptr_(std::exchange(o.ptr_, nullptr)),
        bytes_(std::exchange(o.bytes_, 0)) {}
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      Reset();
      memory_ = std::exchange(o.memory_, nullptr);
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  ~Buffer() { Reset(); }

  void* get() const { return ptr_; }
  template <typename T>
  T* as() const { return static_cast<T*>(ptr_); }
  size_t bytes() const { return bytes_; }
  Memory* memory() const { return memory_; }

 private:
  void Reset() {
    if (ptr_ != nullptr) memory_->Free(ptr_);
    ptr_ = nullptr;
    bytes_ = 0;
  }
  Memory* memory_ = nullptr;
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace recall::kernels
