#include "kernels/cpu/thread_pool.h"

#include <algorithm>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace recall::kernels::cpu {
namespace {

// About 100 us of spinning on current x86 (PAUSE is ~40-140 cycles) before sleeping.
constexpr int kSpinIterations = 2000;

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#else
  std::this_thread::yield();
#endif
}

int ResolveThreads(int requested) {
  if (requested > 0) return requested;
  const unsigned hw = std::thread::hardware_concurrency();
  return hw == 0 ? 1 : static_cast<int>(hw);
}

}  // namespace

ThreadPool::ThreadPool(int num_threads) : num_threads_(ResolveThreads(num_threads)) {
  workers_.reserve(num_threads_ - 1);
  for (int i = 1; i < num_threads_; ++i) {
    workers_.emplace_back([this, i] { WorkerLoop(i); });
  }
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  for (std::thread& t : workers_) t.join();
}

int ThreadPool::NumChunks(int64_t n, int64_t min_per_thread) const {
  if (n <= 0) return 0;
  const int64_t grain = std::max<int64_t>(1, min_per_thread);
  const int64_t by_grain = (n + grain - 1) / grain;
  return static_cast<int>(std::min<int64_t>(num_threads_, std::max<int64_t>(1, by_grain)));
}

void ThreadPool::RunChunk(int chunk) {
  if (chunk >= chunks_) return;
  const int64_t begin = n_ * chunk / chunks_;
  const int64_t end = n_ * (chunk + 1) / chunks_;
  if (begin < end) task_(ctx_, begin, end, chunk);
}

void ThreadPool::Run(int64_t n, int chunks, Task task, void* ctx) {
  task_ = task;
  ctx_ = ctx;
  n_ = n;
  chunks_ = chunks;
  // Every worker takes part in every job (idle ones just check in), so no worker can still
  // be reading the job fields when the next job overwrites them.
  pending_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();

  RunChunk(0);

  for (int spin = 0; pending_.load(std::memory_order_acquire) != 0; ++spin) {
    if (spin < kSpinIterations) {
      CpuRelax();
    } else {
      const int left = pending_.load(std::memory_order_acquire);
      if (left != 0) pending_.wait(left, std::memory_order_acquire);
    }
  }
}

void ThreadPool::WorkerLoop(int index) {
  uint32_t seen = 0;
  while (true) {
    uint32_t gen = generation_.load(std::memory_order_acquire);
    for (int spin = 0; gen == seen; ++spin) {
      if (spin < kSpinIterations) {
        CpuRelax();
      } else {
        generation_.wait(seen, std::memory_order_acquire);
      }
      gen = generation_.load(std::memory_order_acquire);
    }
    seen = gen;
    if (stop_.load(std::memory_order_relaxed)) return;
    RunChunk(index);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) pending_.notify_one();
  }
}

}  // namespace recall::kernels::cpu
