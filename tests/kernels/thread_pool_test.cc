// ThreadPool::ParallelFor: every index runs exactly once, in contiguous chunks with valid
// chunk ids, for many sizes and grains, and across many back-to-back jobs.
#include "kernels/cpu/thread_pool.h"

#include <atomic>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace recall::kernels::cpu {
namespace {

// Scenario: for n in 0..100 and several grains, each index is visited once and chunk ids
// are below num_threads and distinct.
TEST(ThreadPoolTest, CoversEveryIndexOnce) {
  for (int threads : {1, 2, 3, 4}) {
    ThreadPool pool(threads);
    ASSERT_EQ(pool.num_threads(), threads);
    for (int64_t n = 0; n <= 100; ++n) {
      for (int64_t grain : {1, 7, 64}) {
        std::vector<std::atomic<int>> hits(n);
        std::vector<std::atomic<int>> chunk_used(threads);
        pool.ParallelFor(n, grain, [&](int64_t b, int64_t e, int chunk) {
          ASSERT_LT(chunk, threads);
          chunk_used[chunk].fetch_add(1);
          for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
        });
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << n << " " << i;
        for (int t = 0; t < threads; ++t) ASSERT_LE(chunk_used[t].load(), 1);
        EXPECT_EQ(pool.NumChunks(n, grain),
                  n == 0 ? 0 : std::min<int64_t>(threads, (n + grain - 1) / grain));
      }
    }
  }
}

// Scenario: 20000 small jobs back to back (the decode pattern) all complete and sum right.
TEST(ThreadPoolTest, ManyBackToBackJobs) {
  ThreadPool pool(2);
  std::atomic<int64_t> total{0};
  for (int job = 0; job < 20000; ++job) {
    pool.ParallelFor(16, 1, [&](int64_t b, int64_t e, int) { total.fetch_add(e - b); });
  }
  EXPECT_EQ(total.load(), 20000 * 16);
}

// Scenario: 0 threads means hardware concurrency (at least one).
TEST(ThreadPoolTest, DefaultThreadCount) {
  ThreadPool pool(0);
  EXPECT_GE(pool.num_threads(), 1);
}

}  // namespace
}  // namespace recall::kernels::cpu
