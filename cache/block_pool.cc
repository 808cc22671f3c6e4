#include "cache/block_pool.h"

#include <cstdlib>
#include <limits>
#include <new>

#include "absl/strings/str_cat.h"
#include "common/logging.h"

namespace recall::cache {

absl::StatusOr<std::unique_ptr<BlockPool>> BlockPool::Create(const kernels::PagedKvLayout& layout,
                                                             int64_t num_blocks,
                                                             kernels::Memory& memory) {
  if (layout.n_layers <= 0 || layout.n_kv_heads <= 0 || layout.head_dim <= 0 ||
      layout.block_tokens <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "block pool layout: n_layers, n_kv_heads, head_dim and block_tokens must be > 0 (got ",
        layout.n_layers, ", ", layout.n_kv_heads, ", ", layout.head_dim, ", ",
        layout.block_tokens, ")"));
  }
  if (num_blocks < 1 || num_blocks > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("block pool: num_blocks must be in [1, 2^31-1], got ", num_blocks));
  }
  const int64_t block_bytes = layout.BlockBytes();
  if (block_bytes > std::numeric_limits<int64_t>::max() / num_blocks) {
    return absl::InvalidArgumentError("block pool: size overflows");
  }
  const size_t bytes = static_cast<size_t>(block_bytes * num_blocks);
  absl::StatusOr<void*> mem = memory.Allocate(bytes);  // 64-byte aligned
  if (!mem.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat("block pool: cannot allocate ", bytes,
                                                     " bytes for ", num_blocks, " blocks in ",
                                                     memory.Name(), " memory: ",
                                                     mem.status().message()));
  }
  return std::unique_ptr<BlockPool>(
      new BlockPool(layout, num_blocks, static_cast<uint8_t*>(*mem), memory));
}

absl::StatusOr<std::unique_ptr<BlockPool>> BlockPool::CreateWithBytes(
    const kernels::PagedKvLayout& layout, int64_t bytes, kernels::Memory& memory) {
  const int64_t block_bytes = layout.BlockBytes();
  if (block_bytes <= 0) return Create(layout, 0, memory);  // reports the bad layout
  if (bytes < block_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("kv cache bytes: ", bytes,
                                                   " is less than one block (", block_bytes,
                                                   " bytes)"));
  }
  return Create(layout, bytes / block_bytes, memory);
}

BlockPool::BlockPool(const kernels::PagedKvLayout& layout, int64_t num_blocks, uint8_t* base,
                     kernels::Memory& memory)
    : layout_(layout), num_blocks_(num_blocks), base_(base), memory_(memory) {
  free_list_.reserve(static_cast<size_t>(num_blocks));
  // Hand out low ids first.
  for (int64_t i = num_blocks - 1; i >= 0; --i) free_list_.push_back(static_cast<int32_t>(i));
  in_use_.assign(static_cast<size_t>(num_blocks), 0);
}

BlockPool::~BlockPool() { memory_.Free(base_); }

absl::StatusOr<int32_t> BlockPool::Allocate() {
  absl::MutexLock lock(&mu_);
  if (free_list_.empty()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("kv block pool exhausted: all ", num_blocks_, " blocks in use"));
  }
  const int32_t block = free_list_.back();
  free_list_.pop_back();
  in_use_[block] = 1;
  return block;
}

void BlockPool::Free(int32_t block) {
  absl::MutexLock lock(&mu_);
  RECALL_CHECK(block >= 0 && block < num_blocks_) << "block " << block << " out of range";
  RECALL_CHECK(in_use_[block]) << "double free of block " << block;
  in_use_[block] = 0;
  free_list_.push_back(block);
}

int64_t BlockPool::free_blocks() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(free_list_.size());
}

}  // namespace recall::cache
