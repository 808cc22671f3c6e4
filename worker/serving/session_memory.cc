#include "worker/serving/session_memory.h"

#include <algorithm>

#include "common/logging.h"
#include "common/status.h"

namespace recall::serving {

SessionMemory::SessionMemory(std::vector<cache::BlockPool*> pools, int64_t host_budget,
                             Counters counters)
    : pools_(std::move(pools)),
      host_budget_(host_budget),
      counters_(counters),
      scratch_(pools_.size(), 0),
      side_(pools_.size(), 0),
      lent_(pools_.size()),
      deficit_(pools_.size(), 0) {
  RECALL_CHECK(!pools_.empty()) << "SessionMemory needs a pool";
}

SessionMemory::~SessionMemory() {
  for (size_t r = 0; r < pools_.size(); ++r) {
    for (int32_t b : lent_[r]) pools_[r]->Free(b);
  }
}

Session* SessionMemory::Find(const std::string& id) const {
  auto it = sessions_.find(id);
  return it == sessions_.end() ? nullptr : it->second.get();
}

Session& SessionMemory::Add(std::unique_ptr<Session> session) {
  RECALL_CHECK(sessions_.count(session->id) == 0) << "session " << session->id << " held twice";
  Session& s = *session;
  sessions_[s.id] = std::move(session);
  return s;
}

void SessionMemory::DropIfUncached(const std::string& id) {
  Session* s = Find(id);
  if (s != nullptr && s->caches.empty()) Drop(*s);
}

void SessionMemory::Drop(Session& s) {
  if (on_drop_) on_drop_(s);
  if (s.offloaded()) host_bytes_ -= s.host_bytes();
  if (s.episodic != nullptr) {
    host_bytes_ -= s.episodic->parked_host_bytes() + s.episodic->build_host_bytes;
  }
  sessions_.erase(s.id);  // destroys the evictors, then the caches (their blocks go back)
  Settle();
}

bool SessionMemory::Fits(const RankBlocks& need) const {
  for (size_t r = 0; r < need.size(); ++r) {
    if (pools_[r]->free_blocks() < need[r] + deficit_[r]) return false;
  }
  return true;
}

void SessionMemory::SetScratch(RankBytes scratch) {
  RECALL_CHECK(scratch.size() == pools_.size()) << "scratch bytes per rank";
  scratch_ = std::move(scratch);
  Settle();
}

void SessionMemory::Settle() {
  side_ = scratch_;
  for (const auto& [id, s] : sessions_) {
    if (!s->resident()) continue;  // an offloaded session's state counts in host memory
    for (size_t r = 0; r < s->evictors.size() && r < side_.size(); ++r) {
      side_[r] += s->evictors[r]->state_bytes();
    }
  }
  for (size_t r = 0; r < pools_.size(); ++r) {
    cache::BlockPool& pool = *pools_[r];
    const int64_t target = (side_[r] + pool.block_bytes() - 1) / pool.block_bytes();
    std::vector<int32_t>& lent = lent_[r];
    while (static_cast<int64_t>(lent.size()) > target) {
      pool.Free(lent.back());
      lent.pop_back();
    }
    while (static_cast<int64_t>(lent.size()) < target && pool.free_blocks() > 0) {
      absl::StatusOr<int32_t> b = pool.Allocate();
      if (!b.ok()) break;
      pool.memory().Discard(pool.block(*b), static_cast<size_t>(pool.block_bytes()));
      lent.push_back(*b);
    }
    deficit_[r] = target - static_cast<int64_t>(lent.size());
  }
}

int64_t SessionMemory::side_bytes() const {
  int64_t n = 0;
  for (int64_t b : side_) n += b;
  return n;
}

int64_t SessionMemory::side_blocks() const {
  int64_t n = 0;
  for (const auto& lent : lent_) n += static_cast<int64_t>(lent.size());
  return n;
}

int64_t SessionMemory::side_deficit() const {
  return *std::max_element(deficit_.begin(), deficit_.end());
}

int64_t SessionMemory::PoolBlocks() const {
  int64_t n = pools_[0]->num_blocks();
  for (const cache::BlockPool* p : pools_) n = std::min<int64_t>(n, p->num_blocks());
  return n;
}

int64_t SessionMemory::FreeBlocks() const {
  int64_t n = pools_[0]->free_blocks();
  for (const cache::BlockPool* p : pools_) n = std::min<int64_t>(n, p->free_blocks());
  return n;
}

bool SessionMemory::MakeRoom(const RankBlocks& need, const Session* keep,
                             const std::set<const Session*>& running) {
  while (!Fits(need)) {
    // Idle sessions first (least recently used), then sessions whose turn is still waiting
    // (they are restored when it is admitted); never a running turn's or `keep`.
    Session* victim = nullptr;
    for (const bool waiting : {false, true}) {
      for (auto& [id, s] : sessions_) {
        if (s.get() == keep || s->busy != waiting || running.count(s.get()) > 0 || !s->resident() ||
            s->bytes_held() == 0) {
          continue;
        }
        if (victim == nullptr || s->last_used < victim->last_used) victim = s.get();
      }
      if (victim != nullptr) break;
    }
    if (victim == nullptr) return false;
    if (victim->busy) {
      OffloadPinned(*victim);  // its turn must find it again
      counters_.offloads->Increment();
    } else {
      OffloadOrDrop(*victim);
    }
  }
  return true;
}

void SessionMemory::OffloadOrDrop(Session& s) {
  if (HostFits(s.bytes_held() + s.state_bytes())) {  // its host_bytes() once offloaded
    OffloadPinned(s);
    counters_.offloads->Increment();
    return;
  }
  counters_.drops->Increment();
  Drop(s);
}

bool SessionMemory::MakeHostRoom(int64_t extra) {
  while (!HostFits(extra)) {
    Session* victim = nullptr;
    for (auto& [id, held] : sessions_) {
      if (held->busy || !held->offloaded()) continue;
      if (victim == nullptr || held->last_used < victim->last_used) victim = held.get();
    }
    if (victim == nullptr) return false;
    counters_.drops->Increment();
    Drop(*victim);
  }
  return true;
}

void SessionMemory::OffloadPinned(Session& s) {
  if (!s.offloaded()) MakeHostRoom(s.bytes_held() + s.state_bytes());  // its host_bytes() then
  s.Offload();
  host_bytes_ += s.host_bytes();
  Settle();
}

absl::Status SessionMemory::Restore(Session& s) {
  const int64_t host = s.host_bytes();
  RECALL_RETURN_IF_ERROR(s.Restore());
  host_bytes_ -= host;
  counters_.restores->Increment();
  Settle();
  return absl::OkStatus();
}

}  // namespace recall::serving
