// Gemv: y = x * w^T for a few input rows (decode), memory-bandwidth bound.
// Each thread takes a contiguous range of weight rows and streams every weight row from
// memory once for all n input rows (the row stays in L1 while the inputs are applied), with
// a software prefetch of the next rows. SIMD: AVX-512 when the build targets it, else
// AVX2/FMA/F16C, else plain loops. The output of a row does not depend on the thread count.
#pragma once

#include "kernels/cpu/thread_pool.h"
#include "kernels/tensor.h"

namespace recall::kernels::cpu {

// x: [n, w.cols]; y: [n, w.rows]. REQUIRES: n >= 1; y does not alias x.
void Gemv(ThreadPool& pool, const float* x, int n, const Matrix& w, float* y);

}  // namespace recall::kernels::cpu
