// Storage implementations for loaders: a read-only file mapping (with a heap copy when the
// file cannot be mapped) and an aligned heap buffer.
// Thread safety: immutable after creation; MutableData is for the creator only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/model/model.h"

namespace recall::model {

// A 64-byte aligned, zero-initialised heap buffer.
class HeapStorage : public Storage {
 public:
  // Returns ResourceExhausted when the allocation fails.
  static absl::StatusOr<std::unique_ptr<HeapStorage>> Create(size_t bytes);
  ~HeapStorage() override;
  HeapStorage(const HeapStorage&) = delete;
  HeapStorage& operator=(const HeapStorage&) = delete;

  const void* data() const override { return data_; }
  size_t size() const override { return size_; }
  void* MutableData() { return data_; }
  void Discard(const void* begin, size_t bytes) override;

 private:
  HeapStorage(void* data, size_t size) : data_(data), size_(size) {}
  void* data_;
  size_t size_;
};

// Maps `path` read-only (falls back to reading it into a HeapStorage when mmap fails, e.g.
// for an empty file). NotFound when the file does not exist; other failures are Internal.
// The message names the path.
absl::StatusOr<std::unique_ptr<Storage>> MapFile(const std::string& path);

}  // namespace recall::model
