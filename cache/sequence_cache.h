// SequenceCache: one sequence's slice of the BlockPool.
//
// Per layer and per KV head the cache holds `length(layer, head)` slots; every layer has its
// own block table, and slot s of (layer, head) lives in block s / block_tokens of the layer's
// table. Each slot records the token position it came from, so that tokens can later be
// compacted (evicted) and their positions still known. A layer holds as many blocks as its
// longest KV head needs, so per-layer budgets (PyramidKV, profiles) hold less memory in the
// layers with smaller budgets; within a layer the longest head sets the blocks (Ada-KV's
// uneven heads do not free memory). Blocks are returned to the pool as soon as no head of
// their layer needs them (TrimBlocks) and all of them on destruction.
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
  // allocating blocks per layer as needed. ResourceExhausted (and nothing allocated, in any
  // layer) if the pool cannot supply them.
  absl::Status Reserve(int n);

  // Blocks the pool must supply for Reserve(n) to succeed: the sum over layers of
  // ceil((max_length(l) + n) / block_tokens) - num_blocks(l), counting none for a layer that
  // already has room. For an offloaded cache, what RestoreFromHost and then Reserve(n) take.
  int BlocksNeededFor(int n) const;

  // Records that `n` tokens at positions[0..n) were appended to every (layer, head) (the
  // K/V rows are written by Backend::StoreKv). REQUIRES: Reserve(n) succeeded.
  void CommitAppend(const int32_t* positions, int n);

  // The view the kernels read and write. Valid until the next call that changes the blocks
  // held (Reserve, TrimBlocks, Release, OffloadToHost, RestoreFromHost).
  kernels::PagedKv View() const;

  // Slots per KV head for `layer`: [n_kv_heads].
  const int32_t* lengths(int layer) const { return &lengths_[static_cast<size_t>(layer) * n_kv_heads_]; }
  int length(int layer, int head) const { return lengths(layer)[head]; }
  // The longest (layer, head), and the longest head of one layer.
  int max_length() const;
  int max_length(int layer) const;
  // Position of the token in slot `slot` of (layer, head).
  int32_t position(int layer, int head, int slot) const;

  // The next token's position: the number of tokens the sequence has consumed, less what
  // MovePositions took off.
  int32_t next_position() const { return next_position_; }
  // The tokens the sequence has consumed, whatever its positions (the length the budget of a
  // fraction refers to).
  int64_t sequence_length() const { return next_position_ + shifted_; }

  // Gives the held slots new positions: slot s of (layer l, KV head h) gets
  // to[(l * n_kv_heads + h) * stride + s], and the next token `next_position`. The caller has
  // moved the keys (Backend::RerotateKeys). sequence_length() is unchanged. REQUIRES: each
  // row's new positions strictly increase and stay below next_position.
  void MovePositions(const int32_t* to, int64_t stride, int32_t next_position);
  // Every held slot's position, in the same layout.
  void Positions(int32_t* out, int64_t stride) const;

  // Sets the next token's position. Moving it back forgets positions no slot holds any more
  // (EpiCache's patch queries are appended, scored and compacted away, and the next history
  // block reuses their positions); moving it forward leaves a gap (a block-masked
  // calibration pass). REQUIRES: position >= 0 and > the position of every slot held.
  void SetNextPosition(int32_t position);

  // Takes the last n tokens the sequence consumed back out (a reply cut at a stop string
  // gives back the tokens fed after the cut): drops every slot of theirs, in every row,
  // whatever eviction and re-positioning did since (each slot knows when it was fed), and
  // returns the blocks no head needs any more. sequence_length() shrinks by n; the next
  // token's position is where the first of them was (or, after a re-positioning, just past
  // the newest position kept). REQUIRES: not offloaded, 0 <= n <= sequence_length(), and the
  // n tokens were appended one position after another.
  void DropNewest(int n);
  // Moves the next token's position up to `position` keeping sequence_length() (tensor-
  // parallel ranks share one next position; after DropNewest each rank's may differ).
  // REQUIRES: position >= next_position().
  void RaiseNextPosition(int32_t position);

  // Keeps, for (layer, head), only the slots in `keep` (ascending), moving K, V and
  // positions together to the front. REQUIRES: keep is strictly ascending, within length.
  void Compact(int layer, int head, const std::vector<int32_t>& keep);
  // Compact for K/V rows a backend op has already moved (Backend::LazyEvict): only the
  // positions and the length follow keep[0 .. n).
  void CompactMoved(int layer, int head, const int32_t* keep, int n);

  // Returns, in every layer, the blocks that no head of that layer uses any more. Returns
  // how many were freed in all.
  int TrimBlocks();

  // Whether the host may read the K/V rows of View() (false for a GPU's pool).
  bool host_readable() const { return pool_->memory().host_accessible(); }

  // Blocks held: in all (every layer's table) and by one layer.
  int num_blocks() const { return total_blocks_; }
  int num_blocks(int layer) const { return counts_[static_cast<size_t>(layer)]; }
  int64_t bytes_held() const { return num_blocks() * pool_->block_bytes(); }
  // Slots every head of `layer` has room for.
  int capacity(int layer) const { return num_blocks(layer) * block_tokens_; }

  // Returns every block to the pool and resets the sequence to empty (an offloaded copy
  // included).
  void Release();

  // Offload to host memory: copies every layer's held blocks to a host buffer and returns
  // the blocks to the pool; lengths, positions and next_position stay, so policy state kept
  // beside the cache remains valid. RestoreFromHost allocates the same number of blocks per
  // layer again and copies the contents back (ResourceExhausted, still offloaded, when the
  // pool cannot supply them). While offloaded the cache must not be stepped. Offloading an
  // empty or already offloaded cache does nothing.
  void OffloadToHost();
  absl::Status RestoreFromHost();
  bool offloaded() const { return offloaded_blocks_ > 0; }

  // Moves a cache that holds no blocks (offloaded, or empty) to another pool of the same
  // layout: its next RestoreFromHost or Reserve allocates there. For caches built off the
  // serving path (EpiCache's episodes) and then handed to the serving pool.
  // FailedPrecondition if it holds blocks; InvalidArgument if the layouts differ.
  absl::Status Rebind(BlockPool* pool);
  int64_t host_bytes() const { return static_cast<int64_t>(host_.size()); }

 private:
  // Compact's bookkeeping: positions and length of (layer, head) follow keep[0 .. n).
  // Returns whether any slot moves.
  bool Renumber(int layer, int head, const int32_t* keep, int n);
  // Grows every layer l to target_[l] blocks (never shrinks); all or nothing.
  absl::Status GrowToTargets();
  // Frees the blocks of layer l past the first `keep`.
  int ShrinkLayer(int layer, int keep);
  // Refreshes table_ptrs_ / counts_ / total_blocks_ after tables_ changed.
  void SyncTables();

  BlockPool* pool_;
  int n_layers_;
  int n_kv_heads_;
  int block_tokens_;
  std::vector<std::vector<int32_t>> tables_;  // [n_layers][blocks of the layer]
  std::vector<const int32_t*> table_ptrs_;    // [n_layers] tables_[l].data(), for View()
  std::vector<int32_t> counts_;               // [n_layers] tables_[l].size()
  int total_blocks_ = 0;
  std::vector<int32_t> target_;               // [n_layers] scratch of GrowToTargets
  std::vector<int32_t> lengths_;              // [n_layers * n_kv_heads]
  std::vector<std::vector<int32_t>> positions_;  // [n_layers * n_kv_heads][length]
  // When each slot's token was fed: sequence_length() before it, modulo 2^32 (DropNewest).
  std::vector<std::vector<uint32_t>> fed_;  // [n_layers * n_kv_heads][length]
  int32_t next_position_ = 0;
  int64_t shifted_ = 0;                    // positions MovePositions took off next_position_
  std::vector<int32_t> offloaded_counts_;  // [n_layers] blocks the host copy holds per layer
  int offloaded_blocks_ = 0;               // their sum
  std::vector<uint8_t> host_;              // their contents, layer after layer, block after block
};

}  // namespace recall::cache
