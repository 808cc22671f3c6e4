#include "coordinator/router.h"

#include <map>

#include "gtest/gtest.h"

namespace recall::coordinator {
namespace {

WorkerView Worker(const std::string& address, int free, int queued = 0, int active = 0) {
  WorkerView w;
  w.address = address;
  w.healthy = true;
  w.load.set_kv_blocks_total(100);
  w.load.set_kv_blocks_free(free);
  w.load.set_queued_turns(queued);
  w.load.set_active_turns(active);
  return w;
}

TEST(RouterTest, StickyWhileTheBoundWorkerIsHealthy) {
  std::vector<WorkerView> ws = {Worker("a", 100), Worker("b", 100)};
  auto r = Route(ws, "s1", "b", {});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->worker, "b");
  EXPECT_TRUE(r->sticky);
  ws[1].healthy = false;
  r = Route(ws, "s1", "b", {});
  EXPECT_EQ(r->worker, "a");
  EXPECT_FALSE(r->sticky);
  EXPECT_EQ(Route(ws, "s1", "a", {"a"}), std::nullopt) << "every healthy worker excluded";
}

TEST(RouterTest, ConsistentAndWeightedByFreeMemory) {
  std::vector<WorkerView> even = {Worker("a", 100), Worker("b", 100), Worker("c", 100)};
  std::map<std::string, int> count;
  std::map<std::string, std::string> first;
  for (int i = 0; i < 3000; ++i) {
    const std::string s = "s" + std::to_string(i);
    first[s] = Route(even, s, "", {})->worker;
    ++count[first[s]];
  }
  for (const auto& [w, n] : count) EXPECT_NEAR(n, 1000, 150) << w;
  // Losing a worker moves only its sessions.
  std::vector<WorkerView> two = {even[0], even[1]};
  int moved = 0;
  for (const auto& [s, w] : first) {
    if (w != "c" && Route(two, s, "", {})->worker != w) ++moved;
  }
  EXPECT_EQ(moved, 0);
  // A worker with a quarter of the free memory gets far fewer new sessions.
  std::vector<WorkerView> skewed = {Worker("a", 100), Worker("b", 25)};
  int to_b = 0;
  for (int i = 0; i < 2000; ++i) to_b += Route(skewed, "t" + std::to_string(i), "", {})->worker == "b";
  EXPECT_LT(to_b, 2000 / 3);
  EXPECT_GT(to_b, 0);
}

TEST(RouterTest, BoundedLoadAndDrainingSkipBusyWorkers) {
  std::vector<WorkerView> ws = {Worker("a", 100, 0, 40), Worker("b", 100, 0, 0)};
  for (int i = 0; i < 200; ++i) {
    EXPECT_EQ(Route(ws, "s" + std::to_string(i), "", {})->worker, "b");
  }
  ws[1].draining = true;
  EXPECT_EQ(Route(ws, "s1", "", {})->worker, "a");
  EXPECT_EQ(Route(ws, "s1", "b", {})->worker, "b") << "a draining worker keeps its sessions";
}

TEST(RouterTest, WorkersStoringKeepsThoseOfTheNamedKvType) {
  std::vector<WorkerView> ws = {Worker("a", 100), Worker("b", 100), Worker("c", 100)};
  ws[0].info.mutable_default_cache()->set_kv_dtype("bf16");
  ws[1].info.mutable_default_cache()->set_kv_dtype("int8");  // c: no Info yet
  EXPECT_EQ(WorkersStoring(ws, "").size(), 3u) << "no type named: every worker";
  const std::vector<WorkerView> int8 = WorkersStoring(ws, "int8");
  ASSERT_EQ(int8.size(), 1u);
  EXPECT_EQ(int8[0].address, "b");
  EXPECT_TRUE(WorkersStoring(ws, "f16").empty());
  for (int i = 0; i < 50; ++i) {
    EXPECT_EQ(Route(int8, "s" + std::to_string(i), "", {})->worker, "b");
  }
}

}  // namespace
}  // namespace recall::coordinator
