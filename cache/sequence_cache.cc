#include "cache/sequence_cache.h"

#include <algorithm>
#include <cstring>

#include "common/logging.h"
#include "common/status.h"

namespace recall::cache {

SequenceCache::SequenceCache(BlockPool* pool)
    : pool_(pool),
      n_layers_(pool->layout().n_layers),
      n_kv_heads_(pool->layout().n_kv_heads),
      block_tokens_(pool->layout().block_tokens),
      lengths_(static_cast<size_t>(n_layers_) * n_kv_heads_, 0),
      positions_(static_cast<size_t>(n_layers_) * n_kv_heads_) {}

SequenceCache::~SequenceCache() { Release(); }

int SequenceCache::max_length() const {
  return lengths_.empty() ? 0 : *std::max_element(lengths_.begin(), lengths_.end());
}

absl::Status SequenceCache::Reserve(int n) {
  RECALL_CHECK(!offloaded()) << "Reserve on an offloaded cache; RestoreFromHost first";
  const int64_t want = static_cast<int64_t>(max_length()) + n;
  const int64_t blocks_needed = (want + block_tokens_ - 1) / block_tokens_;
  const size_t before = block_table_.size();
  while (static_cast<int64_t>(block_table_.size()) < blocks_needed) {
    absl::StatusOr<int32_t> block = pool_->Allocate();
    if (!block.ok()) {
      // Leave the sequence exactly as it was.
      while (block_table_.size() > before) {
        pool_->Free(block_table_.back());
        block_table_.pop_back();
      }
      return block.status();
    }
    block_table_.push_back(*block);
  }
  return absl::OkStatus();
}

void SequenceCache::CommitAppend(const int32_t* positions, int n) {
  for (size_t lh = 0; lh < lengths_.size(); ++lh) {
    RECALL_CHECK(lengths_[lh] + n <= capacity()) << "CommitAppend without Reserve";
    std::vector<int32_t>& pos = positions_[lh];
    pos.resize(static_cast<size_t>(lengths_[lh]));
    pos.insert(pos.end(), positions, positions + n);
    lengths_[lh] += n;
  }
  if (n > 0) next_position_ = std::max(next_position_, positions[n - 1] + 1);
}

kernels::PagedKv SequenceCache::View() const {
  kernels::PagedKv view;
  view.layout = pool_->layout();
  view.pool = pool_->base();
  view.block_table = block_table_.data();
  view.num_blocks = static_cast<int>(block_table_.size());
  return view;
}

int32_t SequenceCache::position(int layer, int head, int slot) const {
  const size_t lh = static_cast<size_t>(layer) * n_kv_heads_ + head;
  RECALL_CHECK(slot >= 0 && slot < lengths_[lh]) << "slot " << slot << " out of range";
  return positions_[lh][static_cast<size_t>(slot)];
}

void SequenceCache::Compact(int layer, int head, const std::vector<int32_t>& keep) {
  const size_t lh = static_cast<size_t>(layer) * n_kv_heads_ + head;
  const kernels::PagedKv view = View();
  const size_t row_bytes = static_cast<size_t>(view.layout.head_dim) * sizeof(float);
  std::vector<int32_t>& pos = positions_[lh];
  int32_t prev = -1;
  for (size_t i = 0; i < keep.size(); ++i) {
    const int32_t src = keep[i];
    RECALL_CHECK(src > prev && src < lengths_[lh]) << "keep list must ascend within length";
    prev = src;
    const int dst = static_cast<int>(i);
    if (src == dst) continue;
    std::memcpy(view.K(layer, head, dst), view.K(layer, head, src), row_bytes);
    std::memcpy(view.V(layer, head, dst), view.V(layer, head, src), row_bytes);
    pos[i] = pos[static_cast<size_t>(src)];
  }
  lengths_[lh] = static_cast<int32_t>(keep.size());
  pos.resize(keep.size());
}

int SequenceCache::TrimBlocks() {
  const int needed = (max_length() + block_tokens_ - 1) / block_tokens_;
  int freed = 0;
  while (static_cast<int>(block_table_.size()) > needed) {
    pool_->Free(block_table_.back());
    block_table_.pop_back();
    ++freed;
  }
  return freed;
}

void SequenceCache::Release() {
  for (int32_t block : block_table_) pool_->Free(block);
  block_table_.clear();
  offloaded_blocks_ = 0;
  host_.clear();
  host_.shrink_to_fit();
  std::fill(lengths_.begin(), lengths_.end(), 0);
  for (auto& pos : positions_) pos.clear();
  next_position_ = 0;
}

void SequenceCache::OffloadToHost() {
  if (offloaded() || block_table_.empty()) return;
  const int64_t block_floats = pool_->layout().BlockFloats();
  host_.resize(static_cast<size_t>(block_floats) * block_table_.size());
  for (size_t b = 0; b < block_table_.size(); ++b) {
    std::memcpy(host_.data() + b * block_floats,
                pool_->base() + static_cast<int64_t>(block_table_[b]) * block_floats,
                static_cast<size_t>(block_floats) * sizeof(float));
    pool_->Free(block_table_[b]);
  }
  offloaded_blocks_ = static_cast<int>(block_table_.size());
  block_table_.clear();
}

absl::Status SequenceCache::RestoreFromHost() {
  if (!offloaded()) return absl::OkStatus();
  RECALL_CHECK(block_table_.empty()) << "offloaded cache was appended to";
  const int blocks = offloaded_blocks_;
  offloaded_blocks_ = 0;  // Reserve refuses an offloaded cache
  absl::Status st = Reserve(blocks * block_tokens_ - max_length());
  if (!st.ok()) {
    offloaded_blocks_ = blocks;
    return st;
  }
  const int64_t block_floats = pool_->layout().BlockFloats();
  for (size_t b = 0; b < block_table_.size(); ++b) {
    std::memcpy(pool_->base() + static_cast<int64_t>(block_table_[b]) * block_floats,
                host_.data() + b * block_floats, static_cast<size_t>(block_floats) * sizeof(float));
  }
  offloaded_blocks_ = 0;
  host_.clear();
  host_.shrink_to_fit();
  return absl::OkStatus();
}

}  // namespace recall::cache
