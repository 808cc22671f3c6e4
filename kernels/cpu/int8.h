// Int8 weights (DType::kI8, kernels/tensor.h): symmetric, one fp32 scale per row (per output
// channel of a linear layer), and the matrix-vector products over them.
//
// Quantization: s = max|w[r, :]| / 127, q = round-to-nearest-even(w / s) in [-127, 127]; a row
// of zeros gets s = 0 and q = 0. |w - q * s| <= s / 2 for every element.
//
// GemvInt8: y[j, r] = sx[j] * s[r] * sum_k qx[j, k] * q[r, k], the activations quantized per
// input row the same way (sx[j] = max|x[j, :]| / 127). The sum is exact in int32 (cols up to
// 2^31 / 127 / 255 = 66,000), so the result depends only on x[j] and row r: the same bits for
// any batch, thread count or kernel. The kernel is chosen at run time: AVX-512 VNNI where the
// CPU has it (vpdpbusd: unsigned x signed bytes, so the activations are offset by 128 and 128
// times the row's sum, kept beside its scale, is taken off), reading the weights in place for
// few inputs (decode) and through packed panels for many (prefill); plain loops elsewhere.
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

// Which kernel GemvInt8 runs. kAuto: the fastest this CPU has for n; a VNNI kernel asked for on
// a CPU without VNNI runs the plain loops (tests compare the kernels with these).
enum class Int8Kernel { kAuto, kVnniRows, kVnniPanels, kGeneric };

// From this many inputs kAuto packs weight panels (their packing pays off).
inline constexpr int kInt8PanelInputs = 16;

// x: [n, w.cols]; y: [n, w.rows]; w.dtype == kI8 with scales and row_sums. REQUIRES: n >= 1;
// y does not alias x.
void GemvInt8(ThreadPool& pool, const float* x, int n, const Matrix& w, float* y,
              Int8Kernel kernel = Int8Kernel::kAuto);

// Whether this CPU runs the VNNI kernels (for benchmarks' reports).
bool Int8GemvUsesVnni();

}  // namespace recall::kernels::cpu
