// Tensor parallelism on CUDA ranks (stories260K: 8 query heads, 4 KV heads). Skips without a
// GPU. On one GPU the ranks share the device through the staged group (NCCL refuses two ranks
// on one device): TP = 2 and 4 give run.c's golden greedy text, and with eviction keep, in
// every layer and KV head, the token positions one CPU rank keeps. NCCL ranks run the same
// generation when two GPUs are visible; one GPU still runs NCCL queued on a backend's stream
// at one rank.
#include <algorithm>

#include "kernels/comm/communicator.h"
#include "tests/cuda/cuda_test_util.h"
#include "tests/worker/runtime/tp_fixture.h"

namespace recall::runtime::tp {
namespace {

using cache::eviction::SessionEvictorOptions;

std::string Golden() {
  std::string text = testing::ReadFileOrEmpty(
      testing::SharedPath("models/stories260K/golden_greedy_once_upon_a_time_n256.txt"));
  while (!text.empty() && text.back() == '\n') text.pop_back();
  return text;
}

class CudaTpTest : public TpFixture {
 protected:
  void SetUp() override {
    RECALL_REQUIRE_GPU();
    TpFixture::SetUp();
  }

  // A group of CUDA ranks on `devices` (one per rank).
  static std::unique_ptr<TpGroup> MakeCudaGroup(const std::vector<int>& devices,
                                                const std::string& collectives) {
    TpGroupOptions o;
    o.tp = static_cast<int>(devices.size());
    o.device = Device::kCuda;
    o.devices = devices;
    o.tp_comm = collectives == "staged" ? TpComm::kStaged : TpComm::kNccl;
    o.kv_bytes_per_rank = 8ll << 20;
    auto g = TpGroup::Create(*model_, o);
    EXPECT_TRUE(g.ok()) << g.status();
    return g.ok() ? std::move(*g) : nullptr;
  }

  // The golden run.c text: greedy from "Once upon a time", 256 positions, chunked prefill.
  static void ExpectGoldenText(TpGroup& group) {
    auto seq = offline::TpSequence::Create(group, std::nullopt);
    ASSERT_TRUE(seq.ok()) << seq.status();
    const std::vector<int32_t> prompt = tok_->Encode("Once upon a time", true);
    offline::GenerateOptions o;
    o.sampling.temperature = 0.0f;
    o.max_tokens = 256 - static_cast<int>(prompt.size()) + 1;
    o.stop_token_ids = {1};
    o.prefill_chunk = 3;
    auto result = offline::Generate(**seq, group.backend(0), model_->config, *tok_, prompt, o);
    ASSERT_TRUE(result.ok()) << result.status();
    std::vector<int32_t> all = prompt;
    all.insert(all.end(), result->tokens.begin(), result->tokens.end());
    EXPECT_EQ(tok_->Decode(all), Golden()) << "tp " << group.tp() << ", " << group.collectives();
  }
};

TEST_F(CudaTpTest, StagedRanksSharingOneGpuGiveTheGoldenText) {
  for (int tp : {2, 4}) {
    std::unique_ptr<TpGroup> group = MakeCudaGroup(std::vector<int>(tp, 0), "staged");
    ASSERT_NE(group, nullptr);
    EXPECT_EQ(group->collectives(), "staged");
    EXPECT_STREQ(group->backend(1).Name(), "cuda");
    EXPECT_FALSE(group->pool(1).memory().host_accessible()) << "the KV pool is device memory";
    ExpectGoldenText(*group);
  }
}

TEST_F(CudaTpTest, NcclRanksOnTwoGpusGiveTheGoldenText) {
  if (kernels::CudaDeviceCount() < 2) {
    GTEST_SKIP() << "NCCL ranks need two GPUs (" << kernels::CudaDeviceCount() << " visible)";
  }
  std::unique_ptr<TpGroup> group = MakeCudaGroup({0, 1}, "");
  ASSERT_NE(group, nullptr);
  EXPECT_EQ(group->collectives(), "nccl");
  ExpectGoldenText(*group);
}

TEST_F(CudaTpTest, EvictingStagedRanksKeepWhatOneCpuRankKeeps) {
  for (const bool shared : {false, true}) {
    SessionEvictorOptions o;
    o.policy.name = "lazy";
    o.policy.window = 16;
    o.policy.alpha = 1e-3f;
    o.budget.budget = 48;
    o.share_tokens = shared;
    o.verify_keep = true;
    const auto run = [&](TpGroup& group, KeepSets* keep) {
      auto seq = offline::TpSequence::Create(group, o);
      EXPECT_TRUE(seq.ok()) << seq.status();
      auto result = Greedy(group, **seq, "Once upon a time, there was a little girl", 220);
      EXPECT_TRUE(result.ok()) << result.status();
      *keep = CollectKeepSets(group, **seq);
      return result.ok() ? result->tokens : std::vector<int32_t>{};
    };
    std::unique_ptr<TpGroup> cpu = MakeGroup(1);
    std::unique_ptr<TpGroup> gpu = MakeCudaGroup({0, 0}, "staged");
    ASSERT_TRUE(cpu != nullptr && gpu != nullptr);
    KeepSets cpu_keep, gpu_keep;
    const std::vector<int32_t> want = run(*cpu, &cpu_keep);
    const std::vector<int32_t> got = run(*gpu, &gpu_keep);
    ASSERT_FALSE(want.empty());
    EXPECT_EQ(got, want) << (shared ? "shared" : "uniform");
    ASSERT_EQ(gpu_keep.size(), cpu_keep.size());
    for (const auto& [key, positions] : cpu_keep) {
      ASSERT_LT(positions.size(), 220u) << "the budget must force evictions";
      EXPECT_EQ(gpu_keep.at(key), positions)
          << (shared ? "shared" : "uniform") << " layer " << key.first << " KV head " << key.second;
    }
  }
}

// NCCL on a borrowed backend stream, at the one rank one GPU allows: the call runs on that
// stream and leaves the backend's result (one rank's sum is its own data).
TEST_F(CudaTpTest, NcclQueuedOnTheBackendStreamRunsAtOneRank) {
  auto backend = kernels::CreateCudaBackend({0});
  ASSERT_TRUE(backend.ok()) << backend.status();
  auto comms = kernels::CreateNcclGroup({0}, {kernels::CudaStreamOf(**backend)});
  ASSERT_TRUE(comms.ok()) << comms.status();
  const std::vector<float> x0 = kernels::RandomVec(1 << 20, 7);
  const std::vector<float> y0 = kernels::RandomVec(1 << 20, 8);
  kernels::DeviceVec<float> x(**backend, x0), y(**backend, y0);
  (*backend)->Add(x.get(), y.get(), static_cast<int64_t>(x0.size()));
  ASSERT_TRUE((*comms)[0]
                  ->AllReduce(x.get(), static_cast<int64_t>(x0.size()), kernels::ReduceOp::kSum)
                  .ok());
  const std::vector<float> got = x.Download();
  for (size_t i = 0; i < got.size(); i += 4099) EXPECT_EQ(got[i], x0[i] + y0[i]) << i;
}

}  // namespace
}  // namespace recall::runtime::tp
