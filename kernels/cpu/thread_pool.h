// ThreadPool: a small persistent pool for data-parallel loops inside one backend op.
//
//   pool.ParallelFor(rows, /*min_per_thread=*/64, [&](int64_t begin, int64_t end, int t) {
//     for (int64_t r = begin; r < end; ++r) ...;  // t: this chunk's thread index
//   });
//
// [0, n) is split into at most num_threads() contiguous chunks; the calling thread runs
// chunk 0 and the workers the others. ParallelFor returns when every chunk is done.
// Nothing is allocated per call: the callable is passed by pointer. Workers spin briefly
// after a job (ops come back to back during decode) and then sleep on a futex.
// Thread safety: ParallelFor is called by one thread at a time (the backend's user);
// nested calls from inside a chunk are not allowed.
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>
#include <type_traits>
#include <vector>

namespace recall::kernels::cpu {

class ThreadPool {
 public:
  // num_threads counts the calling thread; 0 = std::thread::hardware_concurrency().
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Number of chunks ParallelFor(n, min_per_thread, ...) uses: each chunk gets at least
  // min_per_thread items (except when n is smaller), at most num_threads() chunks.
  int NumChunks(int64_t n, int64_t min_per_thread) const;

  // Runs fn(begin, end, chunk) over contiguous chunks of [0, n). REQUIRES: n >= 0.
  template <typename Fn>
  void ParallelFor(int64_t n, int64_t min_per_thread, Fn&& fn) {
    using F = std::remove_reference_t<Fn>;
    const int chunks = NumChunks(n, min_per_thread);
    if (chunks <= 1) {
      if (n > 0) fn(int64_t{0}, n, 0);
      return;
    }
    Run(n, chunks, &Trampoline<F>, const_cast<void*>(static_cast<const void*>(&fn)));
  }

 private:
  using Task = void (*)(void* ctx, int64_t begin, int64_t end, int chunk);

  template <typename F>
  static void Trampoline(void* ctx, int64_t begin, int64_t end, int chunk) {
    (*static_cast<F*>(ctx))(begin, end, chunk);
  }

  void Run(int64_t n, int chunks, Task task, void* ctx);
  void RunChunk(int chunk);
  void WorkerLoop(int index);

  const int num_threads_;
  std::vector<std::thread> workers_;

  // The current job; written by the caller before generation_ is bumped (release) and read
  // by workers after they observe the bump (acquire).
  Task task_ = nullptr;
  void* ctx_ = nullptr;
  int64_t n_ = 0;
  int chunks_ = 0;

  alignas(64) std::atomic<uint32_t> generation_{0};
  alignas(64) std::atomic<int> pending_{0};  // workers still busy with the current job
  std::atomic<bool> stop_{false};
};

}  // namespace recall::kernels::cpu
