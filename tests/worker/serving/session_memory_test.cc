// SessionMemory: which sessions leave the pools when a turn needs blocks, and the host
// budget's accounting of offloaded caches.
#include "worker/serving/session_memory.h"

#include <numeric>

#include "cache/sequence_cache.h"
#include "gtest/gtest.h"

namespace recall::serving {
namespace {

class SessionMemoryTest : public ::testing::Test {
 protected:
  // 2 layers, 1 KV head, head_dim 4, 4 tokens per block: a 4-token session takes 2 blocks.
  void SetUp() override {
    auto pool = cache::BlockPool::Create({2, 1, 4, 4}, 8);
    ASSERT_TRUE(pool.ok()) << pool.status();
    pool_ = *std::move(pool);
  }

  std::unique_ptr<SessionMemory> Make(int64_t host_budget) {
    return std::make_unique<SessionMemory>(
        std::vector<cache::BlockPool*>{pool_.get()}, host_budget,
        SessionMemory::Counters{.offloads = registry_.GetCounter("offloads", ""),
                                .restores = registry_.GetCounter("restores", ""),
                                .drops = registry_.GetCounter("drops", "")});
  }

  // A session whose cache holds 4 tokens (2 blocks), last used at `last_used`.
  Session& AddSession(SessionMemory& m, const std::string& id, int64_t last_used) {
    auto s = std::make_unique<Session>();
    s->id = id;
    s->last_used = last_used;
    s->caches.push_back(std::make_unique<cache::SequenceCache>(pool_.get()));
    EXPECT_TRUE(s->caches[0]->Reserve(4).ok());
    std::vector<int32_t> positions(4);
    std::iota(positions.begin(), positions.end(), 0);
    s->caches[0]->CommitAppend(positions.data(), 4);
    return m.Add(std::move(s));
  }

  double Count(const char* name) { return registry_.GetCounter(name, "")->value(); }

  metrics::Registry registry_;
  std::unique_ptr<cache::BlockPool> pool_;
};

TEST_F(SessionMemoryTest, MakeRoomOffloadsTheLeastRecentlyUsedIdleSessionFirst) {
  auto m = Make(int64_t{1} << 20);
  Session& old_one = AddSession(*m, "old", 1);
  Session& newer = AddSession(*m, "newer", 5);
  Session& newest = AddSession(*m, "newest", 9);
  ASSERT_EQ(m->FreeBlocks(), 2);
  ASSERT_TRUE(m->MakeRoom({4}, nullptr, {}));
  EXPECT_TRUE(old_one.offloaded());
  EXPECT_TRUE(newer.resident());
  EXPECT_TRUE(newest.resident());
  EXPECT_EQ(m->FreeBlocks(), 4);
  EXPECT_EQ(m->host_bytes(), old_one.host_bytes());
  EXPECT_GT(m->host_bytes(), 0);
  EXPECT_EQ(Count("offloads"), 1);

  // Restoring gives the host bytes back.
  ASSERT_TRUE(m->Restore(old_one).ok());
  EXPECT_TRUE(old_one.resident());
  EXPECT_EQ(m->host_bytes(), 0);
  EXPECT_EQ(Count("restores"), 1);
}

TEST_F(SessionMemoryTest, RunningAndKeptSessionsAreSparedAndWaitingOnesGoLast) {
  auto m = Make(int64_t{1} << 20);
  Session& running = AddSession(*m, "running", 0);
  Session& keep = AddSession(*m, "keep", 1);
  Session& waiting = AddSession(*m, "waiting", 2);
  waiting.busy = true;
  Session& idle = AddSession(*m, "idle", 3);
  ASSERT_EQ(m->FreeBlocks(), 0);
  // Two blocks: the idle session goes although the waiting one was used earlier.
  ASSERT_TRUE(m->MakeRoom({2}, &keep, {&running}));
  EXPECT_TRUE(idle.offloaded());
  EXPECT_TRUE(waiting.resident());
  // Four: then the waiting one too (offloaded, never dropped: its turn must find it).
  ASSERT_TRUE(m->MakeRoom({4}, &keep, {&running}));
  EXPECT_TRUE(waiting.offloaded());
  // Six: only the running and the kept sessions are left: no room.
  EXPECT_FALSE(m->MakeRoom({6}, &keep, {&running}));
  EXPECT_TRUE(running.resident());
  EXPECT_TRUE(keep.resident());
}

TEST_F(SessionMemoryTest, AnIdleSessionIsDroppedWhenTheHostBudgetIsSpent) {
  int64_t one_session = 0;
  {
    auto m = Make(int64_t{1} << 20);
    one_session = AddSession(*m, "probe", 0).bytes_held();
  }
  ASSERT_GT(one_session, 0);
  auto m = Make(one_session);  // room in host memory for one session's cache
  std::vector<std::string> dropped;
  m->set_on_drop([&](const Session& s) { dropped.push_back(s.id); });
  Session& a = AddSession(*m, "a", 1);
  AddSession(*m, "b", 2);
  AddSession(*m, "c", 3);
  AddSession(*m, "d", 4);
  ASSERT_TRUE(m->MakeRoom({4}, nullptr, {}));
  EXPECT_TRUE(a.offloaded());        // fits the host budget
  EXPECT_EQ(m->Find("b"), nullptr);  // does not: dropped
  EXPECT_EQ(dropped, std::vector<std::string>{"b"});
  EXPECT_EQ(Count("drops"), 1);
  EXPECT_EQ(m->host_bytes(), a.host_bytes());
  EXPECT_FALSE(m->HostFits(1));
  // A pinned offload (a preempted or waiting turn's session) drops idle offloaded sessions
  // for its room first: a goes (it passed the budget beside them).
  Session* c = m->Find("c");
  ASSERT_NE(c, nullptr);
  c->busy = true;
  m->OffloadPinned(*c);
  EXPECT_TRUE(c->offloaded());
  EXPECT_EQ(m->Find("a"), nullptr);
  EXPECT_EQ(dropped, (std::vector<std::string>{"b", "a"}));
  EXPECT_EQ(m->host_bytes(), c->host_bytes());
  // With no idle one left on the host it passes the budget: its turn must find it.
  Session* d = m->Find("d");
  ASSERT_NE(d, nullptr);
  d->busy = true;
  m->OffloadPinned(*d);
  EXPECT_TRUE(d->offloaded());
  EXPECT_GT(m->host_bytes(), m->host_budget());
  // Their turns over (both idle, offloaded), the host is trimmed back to the budget: the
  // least recently used goes.
  c->busy = false;
  d->busy = false;
  c->last_used = 7;
  d->last_used = 6;
  m->TrimHost();
  EXPECT_EQ(m->Find("d"), nullptr);
  EXPECT_LE(m->host_bytes(), m->host_budget());
  // Dropping an offloaded session gives its host bytes back.
  m->Drop(*m->Find("c"));
  EXPECT_EQ(m->host_bytes(), 0);
  EXPECT_EQ(m->Find("c"), nullptr);
}

// An offloaded session's policy state stays in host memory: the host budget counts it with
// the cache's copy, so a budget that holds the copy alone does not take the session.
TEST_F(SessionMemoryTest, TheHostBudgetCountsTheOffloadedSessionsPolicyState) {
  auto probe = Make(int64_t{1} << 20);
  Session& s = AddSession(*probe, "lazy", 0);
  cache::eviction::SessionEvictorOptions o;
  o.policy.name = "lazy";
  o.policy.window = 2;
  o.budget.budget = 8;
  o.n_heads = 1;
  auto evictor = cache::eviction::SessionEvictor::Create(o, s.caches[0].get());
  ASSERT_TRUE(evictor.ok()) << evictor.status();
  s.evictors.push_back(*std::move(evictor));
  const std::vector<float> probs(2 * 1 * 8, 0.1f);  // [layers, heads, stride 8]
  ASSERT_TRUE(s.evictors[0]->Step(probs.data(), 8).ok());
  const int64_t kv = s.bytes_held(), state = s.state_bytes();
  ASSERT_GT(state, 0) << "lazy keeps ts and mri for the 4 slots";
  EXPECT_EQ(s.host_bytes(), 0) << "resident";
  probe->OffloadPinned(s);
  EXPECT_EQ(s.host_bytes(), kv + state);
  EXPECT_EQ(probe->host_bytes(), kv + state);
  ASSERT_TRUE(probe->Restore(s).ok());
  EXPECT_EQ(probe->host_bytes(), 0);

  auto tight = Make(kv);  // the cache's copy would fit, the state beside it does not
  std::vector<std::string> dropped;
  tight->set_on_drop([&](const Session& d) { dropped.push_back(d.id); });
  Session& t = AddSession(*tight, "t", 0);
  auto e = cache::eviction::SessionEvictor::Create(o, t.caches[0].get());
  ASSERT_TRUE(e.ok());
  t.evictors.push_back(*std::move(e));
  ASSERT_TRUE(t.evictors[0]->Step(probs.data(), 8).ok());
  tight->OffloadOrDrop(t);
  EXPECT_EQ(dropped, std::vector<std::string>{"t"});
}

TEST_F(SessionMemoryTest, ASessionWithoutACacheIsDroppedOnlyThen) {
  auto m = Make(int64_t{1} << 20);
  auto bare = std::make_unique<Session>();
  bare->id = "bare";
  m->Add(std::move(bare));
  AddSession(*m, "cached", 0);
  m->DropIfUncached("bare");
  m->DropIfUncached("cached");
  m->DropIfUncached("unknown");
  EXPECT_EQ(m->Find("bare"), nullptr);
  EXPECT_NE(m->Find("cached"), nullptr);
}

}  // namespace
}  // namespace recall::serving
