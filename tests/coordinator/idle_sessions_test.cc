// IdleSessions over a real SQLite store: a sweep deletes the sessions idle longer than the
// ttl (the store's DeleteIdle), forgets each, counts them in
// recall_coordinator_sessions_expired_total and leaves the active ones; the thread sweeps on
// its own at its period.
#include "coordinator/idle_sessions.h"

#include <chrono>
#include <set>
#include <string>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "gtest/gtest.h"
#include "tests/common/test_util.h"

namespace recall::coordinator {
namespace {

SessionRecord Session(const std::string& id) {
  SessionRecord r;
  r.id = id;
  r.tenant = "t";
  r.model = "m";
  r.created_unix_ms = UnixMillis();
  return r;
}

TEST(IdleSessionsTest, PeriodIsAQuarterOfTheTtlWithinOneSecondAndAMinute) {
  EXPECT_EQ(IdleSessions::Period(absl::Seconds(1)), absl::Seconds(1));
  EXPECT_EQ(IdleSessions::Period(absl::Seconds(8)), absl::Seconds(2));
  EXPECT_EQ(IdleSessions::Period(absl::Hours(24 * 30)), absl::Seconds(60));
}

TEST(IdleSessionsTest, ASweepDeletesAndForgetsTheIdleSessionsOnly) {
  auto store = OpenSqliteStore(testing::MakeTempDir("idle_sessions") + "/sessions.db");
  ASSERT_TRUE(store.ok()) << store.status();
  WorkerRegistry workers;
  metrics::Registry metrics;
  absl::Mutex mu;
  std::set<std::string> forgotten;
  ASSERT_TRUE((*store)->Create(Session("idle")).ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(1100));
  ASSERT_TRUE((*store)->Create(Session("active")).ok());
  // A ttl of 1 s: the thread's first sweep is a second away, so the one below is the first
  // (unless this thread is held that long: then the thread's deleted "idle").
  IdleSessions sweeper(**store, workers, absl::Seconds(1), metrics,
                       [&](const std::string& tenant, const std::string& id) {
                         absl::MutexLock lock(&mu);
                         forgotten.insert(tenant + "/" + id);
                       });
  EXPECT_LE(sweeper.Sweep(), 1);
  {
    absl::MutexLock lock(&mu);
    EXPECT_EQ(forgotten.count("t/idle"), 1u);
  }
  EXPECT_EQ((*store)->Get("t", "idle").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE((*store)->Get("t", "active").ok());
  EXPECT_NE(metrics.Render().find("recall_coordinator_sessions_expired_total 1"), std::string::npos)
      << metrics.Render();
  // The thread deletes "active" too once it has been idle a second (within a few periods).
  bool deleted = false;
  for (int i = 0; i < 100 && !deleted; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    deleted = (*store)->Get("t", "active").status().code() == absl::StatusCode::kNotFound;
  }
  EXPECT_TRUE(deleted) << "the thread swept within 10 s";
  bool both = false;  // forgotten once the store's delete returned
  for (int i = 0; i < 100 && !both; ++i) {
    {
      absl::MutexLock lock(&mu);
      both = forgotten.size() == 2;
    }
    if (!both) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(both);
}

}  // namespace
}  // namespace recall::coordinator
