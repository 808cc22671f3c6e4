// WorkerRegistry's bookkeeping without workers: a worker that registered itself and stays
// down is forgotten after forget_after (its metric series too); one of --workers is kept; one
// the coordinator cannot reach is told why; polling addresses that do not answer takes one
// deadline, not one per address.
#include "coordinator/worker_registry.h"

#include <chrono>
#include <thread>

#include "common/metrics/registry.h"
#include "gtest/gtest.h"
#include "tests/common/redis_server.h"

namespace recall::coordinator {
namespace {

std::string Nobody() { return "127.0.0.1:" + std::to_string(testing::FreePort()); }

TEST(WorkerRegistryTest, ARegisteredWorkerThatStaysDownIsForgottenAListedOneIsKept) {
  metrics::Registry metrics;
  WorkerRegistry registry(&metrics, absl::Milliseconds(50), 1, grpcutil::ClusterCredential::Open(),
                          absl::Seconds(1));  // (the series read before it is forgotten)
  const std::string listed = Nobody(), registered = Nobody();
  registry.Add(listed);
  registry.Add(registered, /*registered=*/true);
  ASSERT_EQ(registry.Snapshot().size(), 2u);
  const std::string up = "recall_coordinator_worker_up{worker=\"";
  ASSERT_NE(metrics.Render().find(up + registered + "\"} 0"), std::string::npos)
      << metrics.Render();
  bool forgotten = false;
  for (int i = 0; i < 100 && !forgotten; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    forgotten = registry.Snapshot().size() == 1;
  }
  ASSERT_TRUE(forgotten) << "the registered worker is still polled";
  EXPECT_EQ(registry.Snapshot()[0].address, listed);
  EXPECT_FALSE(registry.Snapshot()[0].healthy);
  // Its series went with it (a pod's old address stayed listed at 0); the listed one's stay.
  bool series_gone = false;  // removed just after the worker (ForgetSeries)
  for (int i = 0; i < 100 && !series_gone; ++i) {
    series_gone = metrics.Render().find(registered) == std::string::npos;
    if (!series_gone) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(series_gone) << metrics.Render();
  EXPECT_NE(metrics.Render().find(up + listed + "\"} 0"), std::string::npos) << metrics.Render();
  // Registered again: listed again.
  registry.Add(registered, /*registered=*/true);
  EXPECT_NE(metrics.Render().find(up + registered + "\"} 0"), std::string::npos)
      << metrics.Render();
}

// A worker that registered at an address the coordinator cannot reach is told why it gets no
// turn (it logged "registered" and waited): its Register response's not_used says so.
TEST(WorkerRegistryTest, ARegisteredWorkerThatCannotBeReachedIsToldWhy) {
  WorkerRegistry registry(nullptr, absl::Hours(1), /*max_misses=*/1);
  const std::string address = Nobody();
  registry.Add(address, /*registered=*/true);
  registry.PollAll();
  EXPECT_EQ(registry.NotUsedReason(address),
            "the coordinator's heartbeats to " + address +
                " fail (UNAVAILABLE): is --advertise an address the coordinator can reach?");
  EXPECT_EQ(registry.NotUsedReason(Nobody()), "") << "an unknown address";
}

TEST(WorkerRegistryTest, AddressesThatDoNotAnswerArePolledAtOnce) {
  WorkerRegistry registry(nullptr, absl::Hours(1));
  for (int i = 0; i < 6; ++i) registry.Add(Nobody());
  const auto start = std::chrono::steady_clock::now();
  registry.PollAll();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 3.0) << "six addresses polled one after another would take 6 s at worst";
}

}  // namespace
}  // namespace recall::coordinator
