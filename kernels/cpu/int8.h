// Int8 weights (DType::kI8, kernels/tensor.h): symmetric, one fp32 scale per row (per output
// channel of a linear layer), and the matrix-vector products over them.
//
// Quantization: s = max|w[r, :]| / 127, q = round-to-nearest-even(w / s) in [-127, 127]; a row
// of zeros gets s = 0 and q = 0. |w - q * s| <= s / 2 for every element.
//
// GemvInt8: y[j, r] = sx[j] * s[r] * sum_k qx[j, k] * q[r, k], the activations quantized per
// input row the same way (sx[j] = max|x[j, :]| / 127). The sum is exact in int32 (cols up to
// 2^31 / 127 / 255 = 66,000), so the result depends only on x[j] and row r: the same for
// any batch, thread count or instruction set. AVX-512 VNNI when the build targets it
// (vpdpbusd: unsigned x signed bytes, so the activations are offset by 128 and 128 times the
// row's sum, kept beside its scale, is taken off), else plain loops.
#pragma once

#include <cstdint>

#include "kernels/cpu/thread_pool.h"
#include "kernels/tensor.h"

namespace recall::kernels::cpu {

// Quantizes `rows` rows of `cols` values: q [rows, cols], scales [rows], and, when not null,
// row_sums [rows] (the sum of each row's integers, which GemvInt8 needs).
void QuantizeRowsInt8(const float* w, int64_t rows, int64_t cols, int8_t* q, float* scales,
                      int32_t* row_sums = nullptr);

// Rows [r0, r0 + n) of an int8 matrix as fp32 (q * s) into dst [n, cols].
void DequantizeRowsInt8(const Matrix& w, int64_t r0, int64_t n, float* dst);

// x: [n, w.cols]; y: [n, w.rows]; w.dtype == kI8 with scales and row_sums. REQUIRES: n >= 1;
// y does not alias x.
void GemvInt8(ThreadPool& pool, const float* x, int n, const Matrix& w, float* y);

// Whether GemvInt8 runs the VNNI kernel (for benchmarks' reports).
bool Int8GemvUsesVnni();

}  // namespace recall::kernels::cpu
