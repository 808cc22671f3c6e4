#include "bench/bench_util.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <thread>
#include <vector>

namespace recall::bench {
namespace {

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};
using AlignedFloats = std::unique_ptr<float[], FreeDeleter>;

AlignedFloats AllocFloats(size_t count) {
  const size_t bytes = (count * sizeof(float) + 4095) / 4096 * 4096;
  return AlignedFloats(static_cast<float*>(std::aligned_alloc(4096, bytes)));
}

// Runs fn(begin, end) on num_threads threads over contiguous chunks of [0, n).
template <typename Fn>
void ParallelChunks(int num_threads, size_t n, Fn fn) {
  std::vector<std::thread> threads;
  threads.reserve(num_threads);
  for (int t = 0; t < num_threads; ++t) {
    threads.emplace_back([=] { fn(n * t / num_threads, n * (t + 1) / num_threads); });
  }
  for (std::thread& th : threads) th.join();
}

}  // namespace

double MeasureCopyBandwidthGBs(int num_threads) {
  if (num_threads <= 0) {
    num_threads = std::max(1u, std::thread::hardware_concurrency());
  }
  constexpr size_t kCount = (size_t{256} << 20) / sizeof(float);
  constexpr int kReps = 6;
  AlignedFloats a = AllocFloats(kCount), b = AllocFloats(kCount);
  float* pa = a.get();
  float* pb = b.get();
  // First touch by the threads that will copy.
  ParallelChunks(num_threads, kCount, [=](size_t s, size_t e) {
    for (size_t i = s; i < e; ++i) {
      pa[i] = static_cast<float>(i & 1023);
      pb[i] = 0.0f;
    }
  });
  double best = 0.0;
  for (int rep = 0; rep < kReps; ++rep) {
    const double t0 = NowSeconds();
    ParallelChunks(num_threads, kCount, [=](size_t s, size_t e) {
      for (size_t i = s; i < e; ++i) pb[i] = pa[i];
    });
    const double dt = NowSeconds() - t0;
    best = std::max(best, 2.0 * kCount * sizeof(float) / dt * 1e-9);
  }
  // Keep the copy observable.
  volatile float sink = pb[kCount / 2];
  (void)sink;
  return best;
}

double MeasureSgemmGflops(int m, int n, int k, int num_threads) {
  if (num_threads <= 0) {
    num_threads = std::max(1u, std::thread::hardware_concurrency());
  }
  const int previous_threads = openblas_get_num_threads();
  openblas_set_num_threads(num_threads);
  constexpr int kReps = 5;
  std::vector<float> a(static_cast<size_t>(m) * k), b(static_cast<size_t>(n) * k),
      c(static_cast<size_t>(m) * n);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i % 7) * 0.01f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(i % 5) * 0.01f;
  auto run = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, a.data(), k, b.data(), k,
                0.0f, c.data(), n);
  };
  run();  // warm up OpenBLAS threads and caches
  double best = 0.0;
  for (int rep = 0; rep < kReps; ++rep) {
    const double t0 = NowSeconds();
    run();
    const double dt = NowSeconds() - t0;
    best = std::max(best, 2.0 * m * n * k / dt * 1e-9);
  }
  openblas_set_num_threads(previous_threads);
  return best;
}

}  // namespace recall::bench
