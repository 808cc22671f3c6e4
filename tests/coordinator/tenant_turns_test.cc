#include "coordinator/tenant_turns.h"

#include "gtest/gtest.h"

namespace recall::coordinator {
namespace {

// Each tenant is counted apart: one at its limit is refused (retryable, naming the limit), the
// others are not, and a release lets it in again.
TEST(TenantTurnsTest, ATenantAtItsLimitIsRefusedAndTheOthersAreNot) {
  metrics::Counter counted;
  TenantTurns turns(2, &counted);
  ASSERT_TRUE(turns.Acquire("a").ok());
  ASSERT_TRUE(turns.Acquire("a").ok());
  const absl::Status refused = turns.Acquire("a");
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(refused.message(),
            "the tenant has 2 turns running, the limit is 2 at once (the coordinator's "
            "max_running_per_tenant); retry after 500 ms (retryable)");
  EXPECT_EQ(turns.Check("a").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(turns.Running("a"), 2) << "a refused turn is not counted";
  EXPECT_TRUE(turns.Acquire("b").ok());
  EXPECT_TRUE(turns.Check("c").ok());
  turns.Release("a");
  EXPECT_TRUE(turns.Check("a").ok());
  EXPECT_TRUE(turns.Acquire("a").ok());
  turns.Release("a");
  turns.Release("a");
  turns.Release("a");  // one too many: stays at 0
  EXPECT_EQ(turns.Running("a"), 0);
  EXPECT_EQ(turns.Running("b"), 1);
  EXPECT_EQ(counted.value(), 2) << "the refused Acquire and Check";
}

TEST(TenantTurnsTest, NoLimitRefusesNothing) {
  TenantTurns turns(0);
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(turns.Acquire("a").ok());
  EXPECT_EQ(turns.Running("a"), 1000);
  EXPECT_TRUE(turns.Check("a").ok());
}

}  // namespace
}  // namespace recall::coordinator
