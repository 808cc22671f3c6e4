// MatMul: y = x * w^T for f32 / f16 / bf16 / int8 weights, fp32 activations. Int8 weights
// always take the int8 GEMV (kernels/cpu/int8.h; RunSgemm widens them, for comparison).
//   n <= kGemvMaxInputs: the multithreaded SIMD GEMV (decode; bandwidth bound).
//   larger n: cblas_sgemm (prefill; compute bound). The weight rows are split across the
//   pool's threads, each calling single-threaded OpenBLAS on its share: one set of threads
//   in the process, no OpenBLAS workers spinning against the pool's. f16/bf16 rows are
//   widened into a per-thread fp32 panel (grow-once workspace) and multiplied panel by
//   panel.
// Not thread safe: one caller at a time (like the backend that owns it).
#pragma once

#include <vector>

#include "kernels/cpu/thread_pool.h"
#include "kernels/tensor.h"

namespace recall::kernels::cpu {

class MatMul {
 public:
  // Up to this many input rows use the GEMV path. Measured with
  // recall_kernels_matmul_bench on the development machine (2 cores, AVX-512): the GEMV is
  // faster per input row than sgemm up to n = 24 for 1536x576 and far beyond for 49152x576.
  static constexpr int kGemvMaxInputs = 24;
  // Target size of one widened weight panel, in floats (1 MiB: stays in L2 while sgemm
  // reads it).
  static constexpr int64_t kPanelFloats = int64_t{1} << 18;

  // Configures OpenBLAS (single-threaded, kernels for this CPU; see blas_setup.h).
  explicit MatMul(ThreadPool& pool);

  // x: [n, w.cols]; y: [n, w.rows]. REQUIRES: y does not alias x; n >= 0.
  void Run(const float* x, int n, const Matrix& w, float* y);

  // The two paths, whatever n (for tests and for measuring the crossover).
  void RunGemv(const float* x, int n, const Matrix& w, float* y);
  void RunSgemm(const float* x, int n, const Matrix& w, float* y);

 private:
  // y[:, r0:r1] for weight rows [r0, r1), on the calling thread (`thread` picks its panel).
  void SgemmRows(const float* x, int n, const Matrix& w, int64_t r0, int64_t r1, int thread,
                 float* y);

  ThreadPool& pool_;
  std::vector<std::vector<float>> panels_;  // [thread] widened weight rows; grow once
};

}  // namespace recall::kernels::cpu
