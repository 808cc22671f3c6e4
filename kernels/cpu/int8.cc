#include "kernels/cpu/int8.h"

#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "kernels/cpu/int8_gemm.h"

#define RECALL_VNNI __attribute__((target("avx512f,avx512bw,avx512vnni")))

namespace recall::kernels::cpu {
namespace int8_internal {
namespace {

// The sum of the 16 lanes (through memory: GCC 12 warns inside _mm512_reduce_add_epi32).
RECALL_VNNI inline int32_t SumLanes(__m512i v) {
  alignas(64) int32_t lanes[16];
  _mm512_store_si512(lanes, v);
  int32_t s = 0;
  for (const int32_t x : lanes) s += x;
  return s;
}

// R rows against NB inputs (activations xu: qx + 128 as bytes, [NB, cols]).
template <int R, int NB>
RECALL_VNNI inline void Block(const int8_t* w, const int32_t* row_sums, int64_t cols, int64_t r0,
                              const uint8_t* xu, int32_t (&dot)[R][NB]) {
  __m512i acc[R][NB];
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < NB; ++j) acc[r][j] = _mm512_setzero_si512();
  }
  const int64_t full = cols - cols % 64;
  for (int64_t k = 0; k < full; k += 64) {
    __m512i xv[NB];
    for (int j = 0; j < NB; ++j) xv[j] = _mm512_loadu_si512(xu + j * cols + k);
    for (int r = 0; r < R; ++r) {
      const int8_t* row = w + (r0 + r) * cols + k;
      // The next rows this thread reads (a prefetch past the end does not fault).
      _mm_prefetch(reinterpret_cast<const char*>(row + R * cols), _MM_HINT_T0);
      const __m512i wv = _mm512_loadu_si512(row);
      for (int j = 0; j < NB; ++j) acc[r][j] = _mm512_dpbusd_epi32(acc[r][j], xv[j], wv);
    }
  }
  if (full < cols) {
    const __mmask64 m = (__mmask64{1} << (cols - full)) - 1;
    __m512i xv[NB];
    for (int j = 0; j < NB; ++j) xv[j] = _mm512_maskz_loadu_epi8(m, xu + j * cols + full);
    for (int r = 0; r < R; ++r) {
      const __m512i wv = _mm512_maskz_loadu_epi8(m, w + (r0 + r) * cols + full);
      for (int j = 0; j < NB; ++j) acc[r][j] = _mm512_dpbusd_epi32(acc[r][j], xv[j], wv);
    }
  }
  for (int r = 0; r < R; ++r) {
    const int32_t offset = 128 * row_sums[r0 + r];
    for (int j = 0; j < NB; ++j) dot[r][j] = SumLanes(acc[r][j]) - offset;
  }
}

template <int R, int NB>
RECALL_VNNI inline void Rows(const Matrix& w, int64_t r0, const uint8_t* xu, const float* sx,
                             float* y) {
  int32_t dot[R][NB];
  Block<R, NB>(static_cast<const int8_t*>(w.data), w.row_sums, w.cols, r0, xu, dot);
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < NB; ++j) y[j * w.rows + r0 + r] = sx[j] * w.scales[r0 + r] * dot[r][j];
  }
}

template <int R>
RECALL_VNNI inline void RowsAllInputs(const Matrix& w, int64_t r0, const uint8_t* xu,
                                      const float* sx, int n, float* y) {
  int j = 0;
  for (; j + 4 <= n; j += 4) Rows<R, 4>(w, r0, xu + j * w.cols, sx + j, y + j * w.rows);
  switch (n - j) {
    case 1:
      Rows<R, 1>(w, r0, xu + j * w.cols, sx + j, y + j * w.rows);
      break;
    case 2:
      Rows<R, 2>(w, r0, xu + j * w.cols, sx + j, y + j * w.rows);
      break;
    case 3:
      Rows<R, 3>(w, r0, xu + j * w.cols, sx + j, y + j * w.rows);
      break;
    default:
      break;
  }
}

constexpr int kRowBlock = 4;

// Rows [r, r_end) against every input.
RECALL_VNNI void RowsRange(const Matrix& w, int64_t r, int64_t r_end, const uint8_t* xu,
                           const float* sx, int n, float* y) {
  if (n == 1) {
    for (; r + 8 <= r_end; r += 8) RowsAllInputs<8>(w, r, xu, sx, n, y);
  }
  for (; r + kRowBlock <= r_end; r += kRowBlock) RowsAllInputs<kRowBlock>(w, r, xu, sx, n, y);
  for (; r < r_end; ++r) RowsAllInputs<1>(w, r, xu, sx, n, y);
}

}  // namespace

bool CpuHasVnni() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vnni");
  return has;
}

void VnniRows(ThreadPool& pool, const uint8_t* xu, const float* sx, int n, const Matrix& w,
              float* y) {
  const int64_t rows = w.rows, cols = w.cols;
  const int64_t blocks = (rows + kRowBlock - 1) / kRowBlock;
  const int64_t min_blocks =
      std::max<int64_t>(1, (int64_t{64} << 10) / std::max<int64_t>(1, kRowBlock * cols));
  pool.ParallelFor(blocks, min_blocks, [&](int64_t b0, int64_t b1, int) {
    RowsRange(w, b0 * kRowBlock, std::min(rows, b1 * kRowBlock), xu, sx, n, y);
  });
}

void GenericRows(ThreadPool& pool, const int8_t* qx, const float* sx, int n, const Matrix& w,
                 float* y) {
  const int64_t rows = w.rows, cols = w.cols;
  const int8_t* q = static_cast<const int8_t*>(w.data);
  pool.ParallelFor(rows, 16, [&](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r) {
      const int8_t* row = q + r * cols;
      for (int j = 0; j < n; ++j) {
        int32_t dot = 0;
        const int8_t* xr = qx + j * cols;
        for (int64_t k = 0; k < cols; ++k) dot += int32_t{row[k]} * int32_t{xr[k]};
        y[j * rows + r] = sx[j] * w.scales[r] * dot;
      }
    }
  });
}

}  // namespace int8_internal

bool Int8GemvUsesVnni() { return int8_internal::CpuHasVnni(); }

void GemvInt8(ThreadPool& pool, const float* x, int n, const Matrix& w, float* y,
              Int8Kernel kernel) {
  using namespace int8_internal;
  const int64_t cols = w.cols;
  if (kernel == Int8Kernel::kAuto) {
    kernel = !CpuHasVnni()           ? Int8Kernel::kGeneric
             : n >= kInt8PanelInputs ? Int8Kernel::kVnniPanels
                                     : Int8Kernel::kVnniRows;
  }
  if (kernel != Int8Kernel::kGeneric && !CpuHasVnni()) kernel = Int8Kernel::kGeneric;
  // The activations, quantized per input row; the panels' rows are padded to whole 4-byte
  // groups (zeros, which meet zero weights).
  const int64_t stride = kernel == Int8Kernel::kVnniPanels ? (cols + 3) / 4 * 4 : cols;
  thread_local std::vector<int8_t> qx;
  thread_local std::vector<float> sx;
  qx.resize(static_cast<size_t>(n * stride));
  sx.resize(static_cast<size_t>(n));
  int8_t* qp = qx.data();
  float* sp = sx.data();  // not sx in the lambdas: thread_local, another thread's there
  const bool offset = kernel != Int8Kernel::kGeneric;
  pool.ParallelFor(n, std::max<int64_t>(1, (int64_t{16} << 10) / std::max<int64_t>(1, cols)),
                   [&](int64_t j0, int64_t j1, int) {
                     for (int64_t j = j0; j < j1; ++j) {
                       int8_t* row = qp + j * stride;
                       QuantizeRowsInt8(x + j * cols, 1, cols, row, sp + j);
                       std::fill(row + cols, row + stride, int8_t{0});  // the panels' padding
                       // + 128 as unsigned bytes for vpdpbusd: flipping the sign bit adds 128
                       // to a two's complement byte read as unsigned.
                       if (!offset) continue;
                       uint8_t* u = reinterpret_cast<uint8_t*>(row);
                       for (int64_t k = 0; k < cols; ++k) u[k] ^= 0x80u;
                     }
                   });
  const uint8_t* xu = reinterpret_cast<const uint8_t*>(qp);
  switch (kernel) {
    case Int8Kernel::kVnniPanels:
      VnniPanels(pool, xu, stride, sp, n, w, y);
      break;
    case Int8Kernel::kVnniRows:
      VnniRows(pool, xu, sp, n, w, y);
      break;
    default:
      GenericRows(pool, qp, sp, n, w, y);
      break;
  }
}

}  // namespace recall::kernels::cpu
