// WorkPool: every closure runs once, one thread runs them in the order given, closures may
// queue more, and the destructor runs what is queued before it returns.
#include "coordinator/work_pool.h"

#include <atomic>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace recall::coordinator {
namespace {

TEST(WorkPoolTest, OneThreadRunsClosuresInTheOrderGiven) {
  std::vector<int> order;  // touched by the pool's one thread, read after it joined
  {
    WorkPool pool(1);
    for (int i = 0; i < 100; ++i) pool.Run([&order, i] { order.push_back(i); });
  }
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[i], i);
}

TEST(WorkPoolTest, EveryClosureRunsOnceAndMayQueueMore) {
  std::atomic<int> runs{0};
  absl::Notification chained;
  {
    WorkPool pool(4);
    for (int i = 0; i < 1000; ++i) pool.Run([&runs] { ++runs; });
    pool.Run([&] { pool.Run([&] { chained.Notify(); }); });
    ASSERT_TRUE(chained.WaitForNotificationWithTimeout(absl::Seconds(30)));
  }
  EXPECT_EQ(runs.load(), 1000);
}

}  // namespace
}  // namespace recall::coordinator
