// Machine baselines for the speed benchmarks, measured in the same run as the thing they
// are compared with.
#pragma once

namespace recall::bench {

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
