// Machine baselines for the speed benchmarks, measured in the same run as the thing they
// are compared with; and PrintHelpIfAsked, the --help of every benchmark.
#pragma once

#include <cstdio>
#include <cstring>

namespace recall::bench {

// When any argument is --help or -h: prints `usage` to stdout and returns true (the caller
// then exits 0 before parsing or running anything); false otherwise. Inline, so a benchmark
// that does not link recall_bench_util can use it too:
//   if (PrintHelpIfAsked(argc, argv, kUsage)) return 0;
inline bool PrintHelpIfAsked(int argc, char** argv, const char* usage) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      std::fputs(usage, stdout);
      return true;
    }
  }
  return false;
}

// STREAM-like copy bandwidth: b[i] = a[i] over two 256 MiB float arrays, split across
// num_threads threads (0 = hardware concurrency, the CPU backend's default). Returns the
// best of several repetitions in GB/s (1e9 bytes/s), counting read + write bytes as STREAM
// does. This is the roofline for bandwidth-bound decode.
double MeasureCopyBandwidthGBs(int num_threads = 0);

// cblas_sgemm rate for C[m, n] = A[m, k] * B[n, k]^T (row major; the layout of the CPU
// backend's prefill matmul), best of several repetitions, in GFLOP/s (2*m*n*k flops), with
// OpenBLAS itself running num_threads threads (0 = hardware concurrency); OpenBLAS's
// previous thread count is restored afterwards. Uses OpenBLAS's current kernels: construct
// the CPU backend first, which repairs a fallback kernel choice on CPUs newer than the
// library (see kernels/cpu/blas_setup.h).
double MeasureSgemmGflops(int m, int n, int k, int num_threads = 0);

}  // namespace recall::bench

// The --model and --tokenizer lines of the stories260K benchmarks' --help (string literal
// pieces, for a usage text made of literals).
#define RECALL_BENCH_STORIES_FLAGS_HELP                                                   \
  "  --model PATH            (default " RECALL_SHARED_DIR_DEFAULT                         \
  "/models/stories260K/stories260K.bin;\n"                                                \
  "                          skipped when missing)\n"                                     \
  "  --tokenizer PATH        (default " RECALL_SHARED_DIR_DEFAULT "/models/stories260K/tok512.bin)\n"
