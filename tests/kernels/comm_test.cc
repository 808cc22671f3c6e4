// Communicators: the in-process group (CPU ranks as threads) computes every collective with
// results bitwise identical on all ranks, refuses mismatched calls on every rank instead of
// pairing them, and fails (instead of hanging) when a rank never arrives. The staged group
// (ranks whose buffers the host cannot read) copies through the host and gets the same
// results. The NCCL group's tests run only where a GPU is present.
#include "kernels/comm/communicator.h"

#include <cstring>

#include <functional>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/memory.h"

namespace recall::kernels {
namespace {

// Runs fn(rank, comm) on one thread per rank and returns each rank's status.
std::vector<absl::Status> RunRanks(std::vector<std::unique_ptr<Communicator>>& comms,
                                   const std::function<absl::Status(int, Communicator&)>& fn) {
  std::vector<absl::Status> out(comms.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < comms.size(); ++r) {
    threads.emplace_back([&, r] { out[r] = fn(static_cast<int>(r), *comms[r]); });
  }
  for (std::thread& t : threads) t.join();
  return out;
}

class InProcessTest : public ::testing::TestWithParam<int> {};

TEST_P(InProcessTest, AllReduceSumMaxMinAreExactAndEqualOnEveryRank) {
  const int n = GetParam();
  auto comms = CreateInProcessGroup(n);
  ASSERT_TRUE(comms.ok()) << comms.status();
  constexpr int kCount = 1001;  // not a multiple of the ranks: uneven chunks
  std::vector<std::vector<float>> sums(n), maxes(n);
  std::vector<std::vector<int64_t>> mins(n);
  auto status = RunRanks(*comms, [&](int r, Communicator& c) -> absl::Status {
    sums[r].resize(kCount);
    maxes[r].resize(kCount);
    mins[r].resize(kCount);
    for (int i = 0; i < kCount; ++i) {
      sums[r][i] = 0.1f * (r + 1) + i;
      maxes[r][i] = static_cast<float>((i * 7 + r * 13) % 17);
      mins[r][i] = (i + r * 5) % 11 - 3;
    }
    if (auto st = c.AllReduce(sums[r].data(), kCount, ReduceOp::kSum); !st.ok()) return st;
    if (auto st = c.AllReduce(maxes[r].data(), kCount, ReduceOp::kMax); !st.ok()) return st;
    return c.AllReduce(mins[r].data(), kCount, ReduceOp::kMin);
  });
  for (const auto& st : status) ASSERT_TRUE(st.ok()) << st;
  for (int i = 0; i < kCount; ++i) {
    float sum = 0.1f * 1 + i, mx = 0;
    int64_t mn = 1 << 20;
    for (int r = 1; r < n; ++r) sum += 0.1f * (r + 1) + i;  // rank order, as documented
    for (int r = 0; r < n; ++r) {
      mx = std::max(mx, static_cast<float>((i * 7 + r * 13) % 17));
      mn = std::min<int64_t>(mn, (i + r * 5) % 11 - 3);
    }
    for (int r = 0; r < n; ++r) {
      ASSERT_EQ(sums[r][i], sum) << "rank " << r << " element " << i;
      ASSERT_EQ(maxes[r][i], mx);
      ASSERT_EQ(mins[r][i], mn);
    }
  }
}

TEST_P(InProcessTest, AllGatherBroadcastAndBarrier) {
  const int n = GetParam();
  auto comms = CreateInProcessGroup(n);
  ASSERT_TRUE(comms.ok()) << comms.status();
  std::vector<std::vector<int32_t>> gathered(n);
  std::vector<std::vector<double>> bcast(n);
  auto status = RunRanks(*comms, [&](int r, Communicator& c) -> absl::Status {
    const int32_t send[3] = {r, r * 10, r * 100};
    gathered[r].assign(3 * n, -1);
    if (auto st = c.AllGather(send, gathered[r].data(), 3, CommDType::kI32); !st.ok()) return st;
    bcast[r] = {r + 0.5, -static_cast<double>(r)};
    if (auto st = c.Broadcast(bcast[r].data(), 2, CommDType::kF64, n - 1); !st.ok()) return st;
    return c.Barrier();
  });
  for (const auto& st : status) ASSERT_TRUE(st.ok()) << st;
  for (int r = 0; r < n; ++r) {
    for (int q = 0; q < n; ++q) {
      EXPECT_EQ(gathered[r][3 * q], q);
      EXPECT_EQ(gathered[r][3 * q + 1], q * 10);
      EXPECT_EQ(gathered[r][3 * q + 2], q * 100);
    }
    EXPECT_EQ(bcast[r], (std::vector<double>{n - 1 + 0.5, -static_cast<double>(n - 1)}));
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, InProcessTest, ::testing::Values(1, 2, 3, 4));

TEST(InProcessGroup, MismatchedCallsFailEveryRankAndTheGroupStaysFailed) {
  auto comms = CreateInProcessGroup(2);
  ASSERT_TRUE(comms.ok());
  std::vector<absl::Status> later(2);
  auto status = RunRanks(*comms, [&](int r, Communicator& c) -> absl::Status {
    std::vector<float> x(r == 0 ? 8 : 9, 1.0f);
    absl::Status st = c.AllReduce(x.data(), static_cast<int64_t>(x.size()), ReduceOp::kSum);
    later[r] = c.Barrier();
    return st;
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(status[r].code(), absl::StatusCode::kInternal) << status[r];
    EXPECT_NE(status[r].message().find("AllReduce(8 f32, sum)"), std::string::npos) << status[r];
    EXPECT_NE(status[r].message().find("AllReduce(9 f32, sum)"), std::string::npos);
    EXPECT_FALSE(later[r].ok());
  }
}

TEST(InProcessGroup, ARankThatNeverArrivesFailsTheOthersInsteadOfHangingThem) {
  InProcessGroupOptions o;
  o.timeout = absl::Milliseconds(200);
  auto comms = CreateInProcessGroup(3, o);
  ASSERT_TRUE(comms.ok());
  auto status = RunRanks(*comms, [&](int r, Communicator& c) -> absl::Status {
    if (r == 2) return absl::OkStatus();  // never joins
    return c.Barrier();
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(status[r].code(), absl::StatusCode::kDeadlineExceeded) << status[r];
    EXPECT_NE(status[r].message().find("rank(s) 2"), std::string::npos) << status[r];
  }
}

TEST(InProcessGroup, BadArgumentsAreRejected) {
  EXPECT_EQ(CreateInProcessGroup(0).status().code(), absl::StatusCode::kInvalidArgument);
  auto comms = CreateInProcessGroup(1);
  ASSERT_TRUE(comms.ok());
  double x = 1;
  EXPECT_EQ((*comms)[0]->Broadcast(&x, 1, CommDType::kF64, 1).code(),
            absl::StatusCode::kInvalidArgument);
}

// Host memory that claims not to be host-accessible, as a GPU's is not, and counts the
// copies through it: the staged group must move every buffer through CopyOut / CopyIn.
class OpaqueMemory final : public Memory {
 public:
  const char* Name() const override { return "opaque"; }
  bool host_accessible() const override { return false; }
  absl::StatusOr<void*> Allocate(size_t bytes) override { return HostMemory().Allocate(bytes); }
  void Free(void* p) override { HostMemory().Free(p); }
  void CopyIn(void* dst, const void* src, size_t bytes) override {
    ++copies_in;
    std::memcpy(dst, src, bytes);
  }
  void CopyOut(void* dst, const void* src, size_t bytes) override {
    ++copies_out;
    std::memcpy(dst, src, bytes);
  }
  void Copy(void* dst, const void* src, size_t bytes) override { std::memcpy(dst, src, bytes); }
  void CopyOutRows(void*, size_t, const void*, size_t, size_t, size_t) override {}
  void CompactRows(const PagedKvHead&, const int32_t*, int) override {}
  int copies_in = 0;
  int copies_out = 0;
};

TEST(StagedGroup, CollectivesThroughHostCopiesGiveTheInProcessResults) {
  constexpr int n = 3;
  std::vector<OpaqueMemory> memories(n);
  std::vector<Memory*> ptrs;
  for (auto& m : memories) ptrs.push_back(&m);
  auto comms = CreateStagedGroup(ptrs);
  ASSERT_TRUE(comms.ok()) << comms.status();
  EXPECT_STREQ((*comms)[0]->Name(), "staged");
  std::vector<std::vector<float>> sums(n);
  std::vector<std::vector<int64_t>> gathered(n);
  std::vector<std::vector<int32_t>> bcast(n);
  auto status = RunRanks(*comms, [&](int r, Communicator& c) -> absl::Status {
    sums[r] = {1.0f * r, 0.25f, -2.0f * r};
    if (auto st = c.AllReduce(sums[r].data(), 3, ReduceOp::kSum); !st.ok()) return st;
    const int64_t mine[2] = {r, 100 + r};
    gathered[r].assign(2 * n, -1);
    if (auto st = c.AllGather(mine, gathered[r].data(), 2, CommDType::kI64); !st.ok()) return st;
    bcast[r] = {r, r};
    if (auto st = c.Broadcast(bcast[r].data(), 2, CommDType::kI32, 1); !st.ok()) return st;
    return c.Barrier();
  });
  for (const auto& st : status) ASSERT_TRUE(st.ok()) << st;
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(sums[r], (std::vector<float>{3.0f, 0.75f, -6.0f})) << "rank " << r;
    EXPECT_EQ(gathered[r], (std::vector<int64_t>{0, 100, 1, 101, 2, 102})) << "rank " << r;
    EXPECT_EQ(bcast[r], (std::vector<int32_t>{1, 1})) << "rank " << r;
    // AllReduce and AllGather copy out and back in; Broadcast copies out on the root only
    // and in everywhere else.
    EXPECT_EQ(memories[r].copies_out, r == 1 ? 3 : 2) << "rank " << r;
    EXPECT_EQ(memories[r].copies_in, r == 1 ? 2 : 3) << "rank " << r;
  }
}

TEST(StagedGroup, HostMemoryGoesStraightToTheInProcessGroupAndErrorsPassThrough) {
  std::vector<Memory*> ptrs = {&HostMemory(), &HostMemory()};
  auto comms = CreateStagedGroup(ptrs);
  ASSERT_TRUE(comms.ok()) << comms.status();
  std::vector<std::vector<double>> x(2);
  auto status = RunRanks(*comms, [&](int r, Communicator& c) -> absl::Status {
    x[r] = {r + 1.0};
    return c.AllReduce(x[r].data(), 1, ReduceOp::kMax);
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(status[r].ok()) << status[r];
    EXPECT_EQ(x[r][0], 2.0);
  }
  // A mismatch is still caught on every rank, through the staging.
  OpaqueMemory a, b;
  auto opaque = CreateStagedGroup({&a, &b});
  ASSERT_TRUE(opaque.ok());
  status = RunRanks(*opaque, [&](int r, Communicator& c) -> absl::Status {
    std::vector<float> v(r == 0 ? 4 : 5, 1.0f);
    return c.AllReduce(v.data(), static_cast<int64_t>(v.size()), ReduceOp::kSum);
  });
  for (const auto& st : status) EXPECT_EQ(st.code(), absl::StatusCode::kInternal) << st;
  EXPECT_EQ(CreateStagedGroup({&a, nullptr}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateStagedGroup({}).status().code(), absl::StatusCode::kInvalidArgument);
}

#ifdef RECALL_HAVE_NCCL
TEST(NcclGroup, RepeatedDevicesAndAWrongStreamCountAreRefusedByName) {
  // Checked before any CUDA call, so these run without a GPU too.
  auto twice = CreateNcclGroup({0, 0});
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(twice.status().message().find("appears twice"), std::string::npos) << twice.status();
  auto streams = CreateNcclGroup({0}, {nullptr, nullptr});
  EXPECT_EQ(streams.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(streams.status().message().find("2 streams for 1 devices"), std::string::npos)
      << streams.status();
}
}  // namespace
}  // namespace recall::kernels
#include <cuda_runtime_api.h>

#include "common/cuda/cuda_raii.h"
namespace recall::kernels {
namespace {

TEST(NcclGroup, AllReduceAcrossEveryVisibleDevice) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count < 1) GTEST_SKIP() << "no CUDA device";
  std::vector<int> devices;
  for (int d = 0; d < count; ++d) devices.push_back(d);
  auto comms = CreateNcclGroup(devices);
  ASSERT_TRUE(comms.ok()) << comms.status();
  std::vector<float> result(count * 4);
  auto status = RunRanks(*comms, [&](int r, Communicator& c) -> absl::Status {
    cudaSetDevice(devices[r]);
    float host[4] = {1.0f * r, 2.0f, -1.0f * r, 0.5f};
    auto dev = cuda::DeviceBuffer::Allocate(sizeof(host));
    if (!dev.ok()) return dev.status();
    cudaMemcpy(dev->get(), host, sizeof(host), cudaMemcpyHostToDevice);
    absl::Status st = c.AllReduce(dev->as<float>(), 4, ReduceOp::kSum);
    cudaMemcpy(result.data() + 4 * r, dev->get(), sizeof(host), cudaMemcpyDeviceToHost);
    return st;
  });
  for (const auto& st : status) ASSERT_TRUE(st.ok()) << st;
  const float sum_r = count * (count - 1) / 2.0f;
  for (int r = 0; r < count; ++r) {
    EXPECT_EQ(result[4 * r], sum_r);
    EXPECT_EQ(result[4 * r + 1], 2.0f * count);
    EXPECT_EQ(result[4 * r + 2], -sum_r);
  }
}
#else
TEST(NcclGroup, UnavailableBuildSaysSo) {
  EXPECT_EQ(CreateNcclGroup({0}).status().code(), absl::StatusCode::kUnimplemented);
}
#endif

}  // namespace
}  // namespace recall::kernels
