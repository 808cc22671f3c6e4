// BlockPool: the paged KV store of one device (or one tensor-parallel rank).
//
// One allocation is carved into `num_blocks` fixed-size blocks; a block holds
// `layout.block_tokens` token slots of one layer, for every KV head of this rank, K and V
// (see kernels::PagedKvLayout for the layout inside a block). A sequence holds a block table
// per layer, so room for `t` tokens in every layer takes n_layers * ceil(t / block_tokens)
// blocks: size pools in bytes, or multiply block counts by n_layers. Freeing returns a block
// to the pool at once, so the memory a sequence gives back is exactly measurable.
//
// Thread safety: Allocate/Free/counters are guarded by a mutex; the block memory itself is
// written by whoever owns the block.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "kernels/memory.h"
#include "kernels/tensor.h"

namespace recall::cache {

class BlockPool {
 public:
  // InvalidArgument if the layout has a non-positive dimension or num_blocks < 1;
  // ResourceExhausted if the allocation fails. The blocks live in `memory` (host memory, or
  // a GPU backend's device memory); `memory` must outlive the pool.
  static absl::StatusOr<std::unique_ptr<BlockPool>> Create(
      const kernels::PagedKvLayout& layout, int64_t num_blocks,
      kernels::Memory& memory = kernels::HostMemory());
  // As many blocks as fit in `bytes` (at least one block's worth required).
  static absl::StatusOr<std::unique_ptr<BlockPool>> CreateWithBytes(
      const kernels::PagedKvLayout& layout, int64_t bytes,
      kernels::Memory& memory = kernels::HostMemory());

  ~BlockPool();
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  // A free block id, or ResourceExhausted when none is left.
  absl::StatusOr<int32_t> Allocate();
  // REQUIRES: `block` was returned by Allocate() and not freed since.
  void Free(int32_t block);

  int64_t num_blocks() const { return num_blocks_; }
  int64_t free_blocks() const;
  int64_t used_blocks() const { return num_blocks_ - free_blocks(); }
  int64_t block_bytes() const { return layout_.BlockBytes(); }
  const kernels::PagedKvLayout& layout() const { return layout_; }
  // The first block (blocks are block_bytes() apart).
  uint8_t* base() const { return base_; }
  uint8_t* block(int32_t id) const { return base_ + static_cast<int64_t>(id) * block_bytes(); }
  // Where the blocks live; SequenceCache moves rows through it.
  kernels::Memory& memory() const { return memory_; }

 private:
  BlockPool(const kernels::PagedKvLayout& layout, int64_t num_blocks, uint8_t* base,
            kernels::Memory& memory);

  const kernels::PagedKvLayout layout_;
  const int64_t num_blocks_;
  uint8_t* const base_;
  kernels::Memory& memory_;
  mutable absl::Mutex mu_;
  std::vector<int32_t> free_list_ ABSL_GUARDED_BY(mu_);
  std::vector<uint8_t> in_use_ ABSL_GUARDED_BY(mu_);
};

}  // namespace recall::cache
