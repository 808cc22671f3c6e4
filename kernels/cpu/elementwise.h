// Row-wise and elementwise ops of the CPU backend. Shapes and semantics are those of the
// matching Backend methods (kernels/backend.h). RmsNorm, Rope, Softmax, Embedding, Add and
// AddBias follow llama2.c run.c statement by statement (same float operations in the same
// order, bit-identical results). SiluMul keeps run.c's statements but uses the vector exp
// of simd_math.h (within 2 ulp of expf; the scalar expf made it ~10% of prefill time).
// Large inputs are split across the pool by rows, which does not change any row's
// arithmetic.
#pragma once

#include <cstdint>

#include "kernels/cpu/thread_pool.h"
#include "kernels/tensor.h"

namespace recall::kernels::cpu {

void Embedding(ThreadPool& pool, const Matrix& table, const int32_t* tokens, int n, float* out);
void RmsNorm(ThreadPool& pool, const float* x, const float* weight, int n, int dim, float eps,
             float* out);
// REQUIRES: head_dim even and <= kMaxRopeHeadDim.
void Rope(ThreadPool& pool, float* x, const int32_t* positions, int n, int n_heads, int head_dim,
          float theta, RopeStyle style);
void AddBias(ThreadPool& pool, float* x, const float* bias, int n, int dim);
void Add(ThreadPool& pool, float* x, const float* y, int64_t count);
void SiluMul(ThreadPool& pool, const float* gate, const float* up, int64_t count, float* out);
void Softmax(ThreadPool& pool, float* x, int rows, int cols);

// One row of Softmax: x[0, n) in place, run.c's order (max, expf and sum, divide).
void SoftmaxRow(float* x, int64_t n);

constexpr int kMaxRopeHeadDim = 1024;

}  // namespace recall::kernels::cpu
