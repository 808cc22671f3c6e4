// WorkerRegistry's bookkeeping without workers: a worker that registered itself and stays
// down is forgotten after forget_after; one of --workers is kept; polling addresses that do
// not answer takes one deadline, not one per address.
#include "coordinator/worker_registry.h"

#include <chrono>
#include <thread>

#include "gtest/gtest.h"
#include "tests/common/redis_server.h"

namespace recall::coordinator {
namespace {

std::string Nobody() { return "127.0.0.1:" + std::to_string(testing::FreePort()); }

TEST(WorkerRegistryTest, ARegisteredWorkerThatStaysDownIsForgottenAListedOneIsKept) {
  WorkerRegistry registry(nullptr, absl::Milliseconds(50), 1, grpcutil::ClusterCredential::Open(),
                          absl::Milliseconds(300));
  const std::string listed = Nobody(), registered = Nobody();
  registry.Add(listed);
  registry.Add(registered, /*registered=*/true);
  ASSERT_EQ(registry.Snapshot().size(), 2u);
  bool forgotten = false;
  for (int i = 0; i < 100 && !forgotten; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    forgotten = registry.Snapshot().size() == 1;
  }
  ASSERT_TRUE(forgotten) << "the registered worker is still polled";
  EXPECT_EQ(registry.Snapshot()[0].address, listed);
  EXPECT_FALSE(registry.Snapshot()[0].healthy);
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
