// SessionMemory: the sessions one scheduler holds, and where their KV caches live.
//
// A session's cache is resident (its blocks in every rank's pool), offloaded (copied to host
// memory, its blocks freed), or gone: dropped with the session, which is rebuilt from its
// transcript at its next turn. SessionMemory owns the sessions, counts the host bytes of
// offloaded and parked caches against the host budget, and chooses what leaves the pools when
// a turn needs blocks: idle sessions first, least recently used first, then sessions whose
// turn is still waiting (offloaded even past the host budget: their turn must find them).
// What runs and what waits is the scheduler's business: it names the sessions to spare.
//
// Engine thread only (not thread safe).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "cache/block_pool.h"
#include "common/metrics/registry.h"
#include "worker/serving/session.h"

namespace recall::serving {

class SessionMemory {
 public:
  // Blocks per rank (ranks' pools fill alike except under head-adaptive eviction).
  using RankBlocks = std::vector<int64_t>;
  struct Counters {
    metrics::Counter* offloads = nullptr;  // caches moved to host memory
    metrics::Counter* restores = nullptr;  // caches moved back to the pools
    metrics::Counter* drops = nullptr;     // sessions dropped for lack of host memory
  };

  // `pools`: one per rank, in rank order; they must outlive this. `host_budget`: the host
  // bytes offloaded and parked caches may take (offloads for preemption may pass it).
  SessionMemory(std::vector<cache::BlockPool*> pools, int64_t host_budget, Counters counters);
  ~SessionMemory();  // destroys the sessions (their blocks go back to the pools)
  SessionMemory(const SessionMemory&) = delete;
  SessionMemory& operator=(const SessionMemory&) = delete;

  // Runs before a session is dropped (the scheduler cancels its episode builds).
  void set_on_drop(std::function<void(const Session&)> on_drop) { on_drop_ = std::move(on_drop); }

  Session* Find(const std::string& id) const;
  // Takes the session (replacing none: its id must be new) and returns it.
  Session& Add(std::unique_ptr<Session> session);
  const std::map<std::string, std::unique_ptr<Session>>& sessions() const { return sessions_; }
  // Drops the session when it holds no cache (its first turn failed before making one).
  void DropIfUncached(const std::string& id);
  // Drops the session: its cache wherever it lives (and its parked episodes) and the session.
  void Drop(Session& s);

  // Pools.
  bool Fits(const RankBlocks& need) const;  // every rank's pool has them free
  int64_t PoolBlocks() const;               // the smallest rank pool
  int64_t FreeBlocks() const;               // the fewest free blocks of any rank

  // Offloads or drops sessions until `need` fits (see above); never `keep` or a session in
  // `running`. False when nothing more can be freed.
  bool MakeRoom(const RankBlocks& need, const Session* keep,
                const std::set<const Session*>& running);
  // Offloads while the host budget allows (the cache's copy and the policy's state, which
  // an offloaded session holds in host memory), drops the session otherwise.
  void OffloadOrDrop(Session& s);
  // Offloads a preempted or waiting turn's session, which its turn must find again: idle
  // offloaded sessions are dropped for it first (least recently used first: they are rebuilt
  // from their transcripts), and only when none is left does it pass the host budget. (It
  // passed it with idle sessions on the host: a tester's 1 MiB budget held 1.69 MB under
  // preemptions.) Counts no offload: the caller says what it was.
  void OffloadPinned(Session& s);
  // Drops idle offloaded sessions until the host bytes are within the budget again (after
  // pinned offloads passed it), least recently used first.
  void TrimHost() { MakeHostRoom(0); }
  // Moves an offloaded cache back to the pools (the blocks must be free).
  absl::Status Restore(Session& s);

  // Side memory: what the sessions and their turns hold beside the KV blocks, counted against
  // the pools so that --kv-cache-bytes bounds it too: the resident sessions' eviction state
  // (SessionEvictor::state_bytes) and the turns' scratch (attention probabilities, SnapKV's
  // window, logits for logprobs: SetScratch). Settle lends each rank's pool whole blocks that
  // cover it: nobody else uses them, and a pool in host memory gives their pages back to the
  // system (kernels::Memory::Discard), so the process holds the blocks in use plus the side
  // memory, within the pool's bytes. What a pool has no free block for is a deficit: Fits
  // counts it as needed, so the next admission or batch makes room for it first.
  using RankBytes = std::vector<int64_t>;
  // The turns' scratch bytes per rank (replacing the last); settles.
  void SetScratch(RankBytes scratch);
  // Lends or takes back blocks after the side memory changed (the mutators here call it; the
  // scheduler after each batch, whose eviction steps grow the policies' state).
  void Settle();
  int64_t side_bytes() const;    // summed over the ranks, at the last Settle
  int64_t side_blocks() const;   // blocks lent to it, summed over the ranks
  int64_t side_deficit() const;  // blocks it lacks, the most of any rank

  // Host memory.
  // Drops idle offloaded sessions, least recently used first, until `extra` more host bytes
  // fit the budget; whether they do.
  bool MakeHostRoom(int64_t extra);
  int64_t host_bytes() const { return host_bytes_; }
  int64_t host_budget() const { return host_budget_; }
  // Whether `extra` more host bytes fit the budget once `freed` are given back.
  bool HostFits(int64_t extra, int64_t freed = 0) const {
    return host_bytes_ - freed + extra <= host_budget_;
  }
  // Accounts host bytes that moved without an offload or restore of the session's own cache
  // (episodes parked, installed or replaced; +: taken, -: given back).
  void CountHost(int64_t delta) { host_bytes_ += delta; }

 private:
  const std::vector<cache::BlockPool*> pools_;
  const int64_t host_budget_;
  const Counters counters_;
  std::function<void(const Session&)> on_drop_;
  std::map<std::string, std::unique_ptr<Session>> sessions_;
  int64_t host_bytes_ = 0;
  RankBytes scratch_, side_;
  std::vector<std::vector<int32_t>> lent_;  // per rank: the blocks lent to side memory
  RankBlocks deficit_;
};

}  // namespace recall::serving
