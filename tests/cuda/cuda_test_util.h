// Helpers of the CUDA backend tests: both backends, device copies of host vectors, NaN
// poisoning and the relative error ||out - ref|| / ||ref||. Every test skips without a GPU.
#pragma once

#include <cmath>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cuda_backend.h"

namespace recall::kernels {

#define RECALL_REQUIRE_GPU()                                                  \
  do {                                                                        \
    if (::recall::kernels::CudaDeviceCount() == 0) {                          \
      GTEST_SKIP() << "no CUDA device: the CUDA backend is not exercised";    \
    }                                                                         \
  } while (0)

// A device copy of a host vector (or `count` NaNs), and its way back.
template <typename T>
class DeviceVec {
 public:
  DeviceVec(Backend& gpu, const std::vector<T>& host) : memory_(gpu.memory()), n_(host.size()) {
    auto b = Buffer::Allocate(memory_, bytes());
    EXPECT_TRUE(b.ok()) << b.status();
    buffer_ = std::move(*b);
    memory_.CopyIn(buffer_.get(), host.data(), bytes());
  }
  static DeviceVec Poisoned(Backend& gpu, size_t count) {
    return DeviceVec(gpu, std::vector<T>(count, static_cast<T>(NAN)));
  }
  T* get() const { return buffer_.as<T>(); }
  std::vector<T> Download() const {
    std::vector<T> out(n_);
    memory_.CopyOut(out.data(), buffer_.get(), bytes());
    return out;
  }

 private:
  size_t bytes() const { return n_ * sizeof(T); }
  Memory& memory_;
  size_t n_;
  Buffer buffer_;
};

inline std::vector<float> RandomVec(size_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// ||out - ref|| / ||ref|| over the first `n` elements (all when n < 0); infinity if any
// element of out is not finite.
inline double RelErr(const std::vector<float>& out, const std::vector<float>& ref,
                     int64_t n = -1) {
  if (n < 0) n = static_cast<int64_t>(ref.size());
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(out[i])) return INFINITY;
    num += (double(out[i]) - ref[i]) * (double(out[i]) - ref[i]);
    den += double(ref[i]) * ref[i];
  }
  return den == 0 ? std::sqrt(num) : std::sqrt(num / den);
}

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    RECALL_REQUIRE_GPU();
    auto gpu = CreateCudaBackend();
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    gpu_ = std::move(*gpu);
    cpu_ = CreateCpuBackend({2});
  }
  void TearDown() override {
    if (gpu_ != nullptr) {
      EXPECT_TRUE(gpu_->Health().ok()) << gpu_->Health();
    }
  }
  std::unique_ptr<Backend> cpu_, gpu_;
};

}  // namespace recall::kernels
