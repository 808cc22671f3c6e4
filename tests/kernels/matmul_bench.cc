// Throughput of the CPU matmul paths against the machine's baselines (bench/bench_util.h):
//   - GEMV (decode) as GB/s of weight bytes streamed, vs STREAM-like copy bandwidth;
//   - GEMV vs sgemm per input row for n around the switch (MatMul::kGemvMaxInputs);
//   - the sgemm path (prefill) as GFLOP/s vs cblas_sgemm of the same f32 shape.
// Matrices smaller than the last-level cache are measured warm (repeated calls).
// usage: recall_kernels_matmul_bench [--threads N] [--reps N]
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "bench/bench_util.h"
#include "kernels/cpu/blas_setup.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/thread_pool.h"
#include "tests/kernels/reference.h"

namespace recall::kernels {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

enum class Path { kAuto, kGemv, kSgemm };

// Best seconds per call over reps calls, after one warm-up call.
double Time(cpu::MatMul& mm, Path path, const Matrix& w, int n, int reps) {
  std::vector<float> x = testing::RandomVector(static_cast<int64_t>(n) * w.cols, 1);
  std::vector<float> y(static_cast<size_t>(n) * w.rows);
  auto call = [&] {
    switch (path) {
      case Path::kAuto:
        mm.Run(x.data(), n, w, y.data());
        break;
      case Path::kGemv:
        mm.RunGemv(x.data(), n, w, y.data());
        break;
      case Path::kSgemm:
        mm.RunSgemm(x.data(), n, w, y.data());
        break;
    }
  };
  call();
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t0 = Now();
    call();
    best = std::min(best, Now() - t0);
  }
  return best;
}

struct Shape {
  int rows, cols;
};

int Main(int argc, char** argv) {
  int threads = 0, reps = 30;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
  }
  cpu::ThreadPool pool(threads);
  cpu::MatMul mm(pool);
  const double bw = bench::MeasureCopyBandwidthGBs(pool.num_threads());
  std::printf("threads %d, OpenBLAS kernels %s, copy bandwidth (read+write) %.2f GB/s\n\n",
              pool.num_threads(), cpu::BlasCoreName().c_str(), bw);

  std::printf("GEMV, n = 1\n");
  for (Shape s : {Shape{1536, 576}, Shape{576, 1536}, Shape{49152, 576}}) {
    for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
      testing::TestMatrix w = testing::RandomMatrix(t, s.rows, s.cols, 3);
      const double sec = Time(mm, Path::kGemv, w.m, 1, reps);
      const double gbs = w.m.bytes() / sec * 1e-9;
      std::printf("  %5dx%-5d %-4s %9.1f us %7.2f GB/s of weights = %5.1f%% of copy\n", s.rows,
                  s.cols, DTypeName(t), sec * 1e6, gbs, 100.0 * gbs / bw);
    }
  }

  // Cold: cycle through copies of the matrix totalling ~1 GiB (beyond the last-level
  // cache), so that every call streams its weights from DRAM as a real decode step does.
  std::printf("\nGEMV, n = 1, cold (matrix copies cycled through ~1 GiB)\n");
  for (Shape s : {Shape{1536, 576}, Shape{49152, 576}}) {
    for (DType t : {DType::kF32, DType::kBF16}) {
      testing::TestMatrix w = testing::RandomMatrix(t, s.rows, s.cols, 3);
      const size_t bytes = w.m.bytes();
      const int copies = static_cast<int>((size_t{1} << 30) / bytes) + 1;
      std::vector<uint8_t> arena(bytes * copies);
      for (int c = 0; c < copies; ++c) {
        std::memcpy(arena.data() + c * bytes, w.storage.data(), bytes);
      }
      std::vector<float> x = testing::RandomVector(s.cols, 1), y(s.rows);
      double best = 1e30, total = 0;
      int calls = 0;
      for (int rep = 0; rep < 3; ++rep) {
        const double t_rep = Now();
        for (int c = 0; c < copies; ++c) {
          const Matrix m{arena.data() + c * bytes, t, s.rows, s.cols};
          const double t0 = Now();
          mm.RunGemv(x.data(), 1, m, y.data());
          best = std::min(best, Now() - t0);
        }
        if (rep > 0) {  // the first pass also faults the pages in
          total += Now() - t_rep;
          calls += copies;
        }
      }
      const double avg = total / calls;
      std::printf("  %5dx%-5d %-4s mean %8.1f us %6.2f GB/s = %5.1f%% of copy (best %.2f GB/s)\n",
                  s.rows, s.cols, DTypeName(t), avg * 1e6, bytes / avg * 1e-9,
                  100.0 * bytes / avg * 1e-9 / bw, bytes / best * 1e-9);
    }
  }

  std::printf("\nGEMV vs sgemm path, us per input row (switch at n > %d)\n",
              cpu::MatMul::kGemvMaxInputs);
  for (Shape s : {Shape{1536, 576}, Shape{49152, 576}}) {
    for (DType t : {DType::kF32, DType::kBF16}) {
      testing::TestMatrix w = testing::RandomMatrix(t, s.rows, s.cols, 3);
      for (int n : {2, 4, 8, 12, 16, 24, 32}) {
        const int r = std::max(3, reps / 3);
        const double g = Time(mm, Path::kGemv, w.m, n, r) / n;
        const double b = Time(mm, Path::kSgemm, w.m, n, r) / n;
        std::printf("  %5dx%-5d %-4s n=%-3d gemv %8.1f  sgemm %8.1f  %s\n", s.rows, s.cols,
                    DTypeName(t), n, g * 1e6, b * 1e6, g <= b ? "gemv" : "sgemm");
      }
    }
  }

  std::printf("\nPrefill (sgemm path) vs cblas_sgemm of the f32 shape\n");
  for (Shape s : {Shape{1536, 576}, Shape{576, 1536}}) {
    for (int n : {64, 512}) {
      const double ref = bench::MeasureSgemmGflops(n, s.rows, s.cols, pool.num_threads());
      for (DType t : {DType::kF32, DType::kBF16}) {
        testing::TestMatrix w = testing::RandomMatrix(t, s.rows, s.cols, 3);
        const double sec = Time(mm, Path::kAuto, w.m, n, std::max(3, reps / 4));
        const double gf = 2.0 * n * s.rows * s.cols / sec * 1e-9;
        std::printf("  %5dx%-5d %-4s n=%-3d %9.1f us %7.1f GFLOP/s = %5.1f%% of sgemm %.1f\n",
                    s.rows, s.cols, DTypeName(t), n, sec * 1e6, gf, 100.0 * gf / ref, ref);
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace recall::kernels

int main(int argc, char** argv) { return recall::kernels::Main(argc, argv); }
