// SequenceCache: one sequence's slice of the BlockPool.
//
// Per layer and per KV head the cache holds `length(layer, head)` slots; slot s of every
// (layer, head) lives in block block_table[s / block_tokens]. Each slot records the token
// position it came from, so that tokens can later be compacted (evicted) and their positions
// still known. The number of blocks held is set by the longest (layer, head); blocks are
// returned to the pool as soon as no (layer, head) needs them (TrimBlocks) and all of them
// on destruction.
//
// Not thread safe: a sequence is stepped by one thread at a time.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "cache/block_pool.h"
#include "kernels/tensor.h"

namespace recall::cache {

class SequenceCache {
 public:
  explicit SequenceCache(BlockPool* pool);
  ~SequenceCache();
  SequenceCache(const SequenceCache&) = delete;
  SequenceCache& operator=(const SequenceCache&) = delete;

  // Makes room for `n` more slots after the current length of every (layer, head),
  // allocating blocks as needed. ResourceExhausted (and nothing allocated) if the pool
  // cannot supply them.
  absl::Status Reserve(int n);

  // Records that `n` tokens at positions[0..n) were appended to every (layer, head) (the
  // K/V rows are written by Backend::StoreKv). REQUIRES: Reserve(n) succeeded.
  void CommitAppend(const int32_t* positions, int n);

  // The view the kernels read and write.
  kernels::PagedKv View() const;

  // Slots per KV head for `layer`: [n_kv_heads].
  const int32_t* lengths(int layer) const { return &lengths_[static_cast<size_t>(layer) * n_kv_heads_]; }
  int length(int layer, int head) const { return lengths(layer)[head]; }
  int max_length() const;
  // Position of the token in slot `slot` of (layer, head).
  int32_t position(int layer, int head, int slot) const;

  // Number of tokens the sequence has consumed (the next token's position).
  int32_t next_position() const { return next_position_; }

  // Keeps, for (layer, head), only the slots in `keep` (ascending), moving K, V and
  // positions together to the front. REQUIRES: keep is strictly ascending, within length.
  void Compact(int layer, int head, const std::vector<int32_t>& keep);

  // Returns blocks that no (layer, head) uses any more. Returns how many were freed.
  int TrimBlocks();

  int num_blocks() const { return static_cast<int>(block_table_.size()); }
  int64_t bytes_held() const { return num_blocks() * pool_->block_bytes(); }
  int capacity() const { return num_blocks() * block_tokens_; }

  // Returns every block to the pool and resets the sequence to empty (an offloaded copy
  // included).
  void Release();

  // Offload to host memory: copies the used slots of every held block to a host buffer and
  // returns the blocks to the pool; lengths, positions and next_position stay, so policy
  // state kept beside the cache remains valid. RestoreFromHost allocates blocks again and
  // copies the contents back (ResourceExhausted, still offloaded, when the pool cannot
  // supply them). While offloaded the cache must not be stepped. Offloading an empty or
  // already offloaded cache does nothing.
  void OffloadToHost();
  absl::Status RestoreFromHost();
  bool offloaded() const { return offloaded_blocks_ > 0; }
  int64_t host_bytes() const { return static_cast<int64_t>(host_.size() * sizeof(float)); }

 private:
  BlockPool* pool_;
  int n_layers_;
  int n_kv_heads_;
  int block_tokens_;
  std::vector<int32_t> block_table_;
  std::vector<int32_t> lengths_;    // [n_layers * n_kv_heads]
  std::vector<std::vector<int32_t>> positions_;  // [n_layers * n_kv_heads][length]
  int32_t next_position_ = 0;
  int offloaded_blocks_ = 0;  // blocks the host copy stands for
  std::vector<float> host_;   // their contents, block after block
};

}  // namespace recall::cache
