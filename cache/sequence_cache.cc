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
      tables_(static_cast<size_t>(n_layers_)),
      table_ptrs_(static_cast<size_t>(n_layers_), nullptr),
      counts_(static_cast<size_t>(n_layers_), 0),
      target_(static_cast<size_t>(n_layers_), 0),
      lengths_(static_cast<size_t>(n_layers_) * n_kv_heads_, 0),
      positions_(static_cast<size_t>(n_layers_) * n_kv_heads_),
      fed_(static_cast<size_t>(n_layers_) * n_kv_heads_),
      offloaded_counts_(static_cast<size_t>(n_layers_), 0) {}

SequenceCache::~SequenceCache() { Release(); }

int SequenceCache::max_length() const {
  return lengths_.empty() ? 0 : *std::max_element(lengths_.begin(), lengths_.end());
}

int SequenceCache::max_length(int layer) const {
  const int32_t* len = lengths(layer);
  return *std::max_element(len, len + n_kv_heads_);
}

void SequenceCache::SyncTables() {
  total_blocks_ = 0;
  for (size_t l = 0; l < tables_.size(); ++l) {
    table_ptrs_[l] = tables_[l].data();
    counts_[l] = static_cast<int32_t>(tables_[l].size());
    total_blocks_ += counts_[l];
  }
}

absl::Status SequenceCache::GrowToTargets() {
  absl::Status status;
  for (size_t l = 0; l < tables_.size() && status.ok(); ++l) {
    std::vector<int32_t>& table = tables_[l];
    while (static_cast<int32_t>(table.size()) < target_[l]) {
      absl::StatusOr<int32_t> block = pool_->Allocate();
      if (!block.ok()) {
        status = block.status();
        break;
      }
      table.push_back(*block);
    }
  }
  if (!status.ok()) {
    // Leave the sequence exactly as it was: every layer back to its previous count.
    for (size_t l = 0; l < tables_.size(); ++l) ShrinkLayer(static_cast<int>(l), counts_[l]);
  }
  SyncTables();
  return status;
}

int SequenceCache::ShrinkLayer(int layer, int keep) {
  std::vector<int32_t>& table = tables_[static_cast<size_t>(layer)];
  int freed = 0;
  while (static_cast<int>(table.size()) > keep) {
    pool_->Free(table.back());
    table.pop_back();
    ++freed;
  }
  return freed;
}

absl::Status SequenceCache::Reserve(int n) {
  RECALL_CHECK(!offloaded()) << "Reserve on an offloaded cache; RestoreFromHost first";
  bool grows = false;
  for (int l = 0; l < n_layers_; ++l) {
    const int64_t want = static_cast<int64_t>(max_length(l)) + n;
    target_[l] = static_cast<int32_t>((want + block_tokens_ - 1) / block_tokens_);
    grows |= target_[l] > counts_[l];
  }
  return grows ? GrowToTargets() : absl::OkStatus();
}

int SequenceCache::BlocksNeededFor(int n) const {
  int need = 0;
  for (int l = 0; l < n_layers_; ++l) {
    const int64_t want = static_cast<int64_t>(max_length(l)) + n;
    const int blocks = std::max(static_cast<int>((want + block_tokens_ - 1) / block_tokens_),
                                offloaded_counts_[l]);
    need += std::max(0, blocks - counts_[l]);
  }
  return need;
}

void SequenceCache::CommitAppend(const int32_t* positions, int n) {
  for (size_t lh = 0; lh < lengths_.size(); ++lh) {
    RECALL_CHECK(lengths_[lh] + n <= capacity(static_cast<int>(lh) / n_kv_heads_))
        << "CommitAppend without Reserve";
    std::vector<int32_t>& pos = positions_[lh];
    pos.resize(static_cast<size_t>(lengths_[lh]));
    pos.insert(pos.end(), positions, positions + n);
    std::vector<uint32_t>& fed = fed_[lh];
    fed.resize(static_cast<size_t>(lengths_[lh]));
    for (int i = 0; i < n; ++i) fed.push_back(static_cast<uint32_t>(positions[i] + shifted_));
    lengths_[lh] += n;
  }
  if (n > 0) next_position_ = std::max(next_position_, positions[n - 1] + 1);
}

kernels::PagedKv SequenceCache::View() const {
  kernels::PagedKv view;
  view.layout = pool_->layout();
  view.pool = pool_->base();
  view.block_tables = table_ptrs_.data();
  view.block_counts = counts_.data();
  return view;
}

int32_t SequenceCache::position(int layer, int head, int slot) const {
  const size_t lh = static_cast<size_t>(layer) * n_kv_heads_ + head;
  RECALL_CHECK(slot >= 0 && slot < lengths_[lh]) << "slot " << slot << " out of range";
  return positions_[lh][static_cast<size_t>(slot)];
}

void SequenceCache::Compact(int layer, int head, const std::vector<int32_t>& keep) {
  const int n = static_cast<int>(keep.size());
  const bool moves = Renumber(layer, head, keep.data(), n);
  if (moves) pool_->memory().CompactRows(View().Head(layer, head), keep.data(), n);
}

void SequenceCache::CompactMoved(int layer, int head, const int32_t* keep, int n) {
  Renumber(layer, head, keep, n);
}

bool SequenceCache::Renumber(int layer, int head, const int32_t* keep, int n) {
  const size_t lh = static_cast<size_t>(layer) * n_kv_heads_ + head;
  std::vector<int32_t>& pos = positions_[lh];
  std::vector<uint32_t>& fed = fed_[lh];
  int32_t prev = -1;
  bool moves = false;
  for (int i = 0; i < n; ++i) {
    const int32_t src = keep[i];
    RECALL_CHECK(src > prev && src < lengths_[lh]) << "keep list must ascend within length";
    prev = src;
    if (src == i) continue;
    moves = true;
    pos[static_cast<size_t>(i)] = pos[static_cast<size_t>(src)];
    fed[static_cast<size_t>(i)] = fed[static_cast<size_t>(src)];
  }
  lengths_[lh] = n;
  pos.resize(static_cast<size_t>(n));
  fed.resize(static_cast<size_t>(n));
  return moves;
}

void SequenceCache::SetNextPosition(int32_t position) {
  RECALL_CHECK(position >= 0) << "negative position " << position;
  for (size_t lh = 0; lh < positions_.size(); ++lh) {
    for (int s = 0; s < lengths_[lh]; ++s) {
      RECALL_CHECK(positions_[lh][static_cast<size_t>(s)] < position)
          << "SetNextPosition(" << position << ") at or below a held slot's position";
    }
  }
  next_position_ = position;
}

void SequenceCache::DropNewest(int n) {
  RECALL_CHECK(n >= 0 && n <= sequence_length())
      << "DropNewest(" << n << ") of " << sequence_length() << " tokens";
  RECALL_CHECK(!offloaded()) << "DropNewest on an offloaded cache";
  if (n == 0) return;
  // Slots fed at or after `from` go (sequence numbers compared modulo 2^32: the slots are
  // less than 2^31 tokens apart).
  const int64_t sequence = sequence_length();
  const uint32_t from = static_cast<uint32_t>(sequence - n);
  int32_t held_end = 0;  // past the newest position kept
  for (size_t lh = 0; lh < positions_.size(); ++lh) {
    int32_t len = lengths_[lh];
    while (len > 0 && static_cast<int32_t>(fed_[lh][static_cast<size_t>(len) - 1] - from) >= 0) {
      --len;
    }
    lengths_[lh] = len;
    positions_[lh].resize(static_cast<size_t>(len));
    fed_[lh].resize(static_cast<size_t>(len));
    if (len > 0) held_end = std::max(held_end, positions_[lh].back() + 1);
  }
  // Where the first token dropped was, unless a re-positioning since moved the slots kept
  // past it (they then keep their positions, and the next token follows the newest).
  next_position_ = std::max(next_position_ - n, held_end);
  shifted_ = sequence - n - next_position_;
  TrimBlocks();
}

void SequenceCache::RaiseNextPosition(int32_t position) {
  RECALL_CHECK(position >= next_position_)
      << "RaiseNextPosition(" << position << ") below " << next_position_;
  shifted_ -= position - next_position_;
  next_position_ = position;
}

void SequenceCache::MovePositions(const int32_t* to, int64_t stride, int32_t next_position) {
  RECALL_CHECK(next_position >= 0) << "negative position " << next_position;
  for (size_t lh = 0; lh < positions_.size(); ++lh) {
    for (int s = 0; s < lengths_[lh]; ++s) {
      const int32_t p = to[static_cast<int64_t>(lh) * stride + s];
      RECALL_CHECK(p < next_position && (s == 0 || p > positions_[lh][static_cast<size_t>(s) - 1]))
          << "MovePositions: row " << lh << " slot " << s << " to " << p;
      positions_[lh][static_cast<size_t>(s)] = p;
    }
  }
  shifted_ += static_cast<int64_t>(next_position_) - next_position;
  next_position_ = next_position;
}

void SequenceCache::Positions(int32_t* out, int64_t stride) const {
  for (size_t lh = 0; lh < positions_.size(); ++lh) {
    std::copy(positions_[lh].begin(), positions_[lh].begin() + lengths_[lh],
              out + static_cast<int64_t>(lh) * stride);
  }
}

int SequenceCache::TrimBlocks() {
  int freed = 0;
  for (int l = 0; l < n_layers_; ++l) {
    freed += ShrinkLayer(l, (max_length(l) + block_tokens_ - 1) / block_tokens_);
  }
  if (freed > 0) SyncTables();
  return freed;
}

absl::Status SequenceCache::Rebind(BlockPool* pool) {
  if (total_blocks_ > 0) {
    return absl::FailedPreconditionError("Rebind: the cache holds blocks; offload it first");
  }
  const kernels::PagedKvLayout& a = pool_->layout();
  const kernels::PagedKvLayout& b = pool->layout();
  if (a.n_layers != b.n_layers || a.n_kv_heads != b.n_kv_heads || a.head_dim != b.head_dim ||
      a.block_tokens != b.block_tokens) {
    return absl::InvalidArgumentError("Rebind: the pools' layouts differ");
  }
  pool_ = pool;
  return absl::OkStatus();
}

void SequenceCache::Release() {
  for (int l = 0; l < n_layers_; ++l) ShrinkLayer(l, 0);
  SyncTables();
  std::fill(offloaded_counts_.begin(), offloaded_counts_.end(), 0);
  offloaded_blocks_ = 0;
  host_.clear();
  host_.shrink_to_fit();
  std::fill(lengths_.begin(), lengths_.end(), 0);
  for (auto& pos : positions_) pos.clear();
  for (auto& fed : fed_) fed.clear();
  next_position_ = 0;
  shifted_ = 0;
}

void SequenceCache::OffloadToHost() {
  if (offloaded() || total_blocks_ == 0) return;
  const size_t block_bytes = static_cast<size_t>(pool_->block_bytes());
  host_.resize(block_bytes * total_blocks_);
  uint8_t* dst = host_.data();
  for (int l = 0; l < n_layers_; ++l) {
    for (int32_t block : tables_[static_cast<size_t>(l)]) {
      pool_->memory().CopyOut(dst, pool_->block(block), block_bytes);
      dst += block_bytes;
    }
    offloaded_counts_[static_cast<size_t>(l)] = counts_[static_cast<size_t>(l)];
    offloaded_blocks_ += ShrinkLayer(l, 0);
  }
  SyncTables();
}

absl::Status SequenceCache::RestoreFromHost() {
  if (!offloaded()) return absl::OkStatus();
  RECALL_CHECK(total_blocks_ == 0) << "offloaded cache was appended to";
  target_ = offloaded_counts_;
  RECALL_RETURN_IF_ERROR(GrowToTargets());  // still offloaded on failure
  const size_t block_bytes = static_cast<size_t>(pool_->block_bytes());
  const uint8_t* src = host_.data();
  for (const std::vector<int32_t>& table : tables_) {
    for (int32_t block : table) {
      pool_->memory().CopyIn(pool_->block(block), src, block_bytes);
      src += block_bytes;
    }
  }
  std::fill(offloaded_counts_.begin(), offloaded_counts_.end(), 0);
  offloaded_blocks_ = 0;
  host_.clear();
  host_.shrink_to_fit();
  return absl::OkStatus();
}

}  // namespace recall::cache
