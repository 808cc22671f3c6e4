#include "kernels/cpu/int8.h"

#include <immintrin.h>

#include <algorithm>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define RECALL_INT8_VNNI 1
#endif

namespace recall::kernels::cpu {
namespace {

#if defined(RECALL_INT8_VNNI)
// The sum of the 16 lanes (through memory: GCC 12 warns inside _mm512_reduce_add_epi32).
inline int32_t SumLanes(__m512i v) {
  alignas(64) int32_t lanes[16];
  _mm512_store_si512(lanes, v);
  int32_t s = 0;
  for (const int32_t x : lanes) s += x;
  return s;
}

// R rows against NB inputs (activations xu: qx + 128 as bytes, [NB, cols]).
template <int R, int NB>
inline void Block(const int8_t* w, const int32_t* row_sums, int64_t cols, int64_t r0,
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
inline void Rows(const Matrix& w, int64_t r0, const uint8_t* xu, const float* sx, float* y) {
  int32_t dot[R][NB];
  Block<R, NB>(static_cast<const int8_t*>(w.data), w.row_sums, w.cols, r0, xu, dot);
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < NB; ++j) y[j * w.rows + r0 + r] = sx[j] * w.scales[r0 + r] * dot[r][j];
  }
}

template <int R>
inline void RowsAllInputs(const Matrix& w, int64_t r0, const uint8_t* xu, const float* sx, int n,
                          float* y) {
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
#endif

}  // namespace

bool Int8GemvUsesVnni() {
#if defined(RECALL_INT8_VNNI)
  return true;
#else
  return false;
#endif
}

void GemvInt8(ThreadPool& pool, const float* x, int n, const Matrix& w, float* y) {
  const int64_t rows = w.rows, cols = w.cols;
  // The activations, quantized per input row (the calling thread; small next to the weights).
  thread_local std::vector<int8_t> qx;
  thread_local std::vector<float> sx;
  qx.resize(static_cast<size_t>(n * cols));
  sx.resize(static_cast<size_t>(n));
  QuantizeRowsInt8(x, n, cols, qx.data(), sx.data());
#if defined(RECALL_INT8_VNNI)
  // qx + 128 as unsigned bytes, in place: flipping the sign bit adds 128 to a two's
  // complement byte read as unsigned.
  uint8_t* xu = reinterpret_cast<uint8_t*>(qx.data());
  for (size_t i = 0; i < qx.size(); ++i) xu[i] ^= 0x80u;
  constexpr int kRowBlock = 4;
  const int64_t blocks = (rows + kRowBlock - 1) / kRowBlock;
  const int64_t min_blocks =
      std::max<int64_t>(1, (int64_t{64} << 10) / std::max<int64_t>(1, kRowBlock * cols));
  const uint8_t* xp = xu;
  const float* sp = sx.data();
  pool.ParallelFor(blocks, min_blocks, [&](int64_t b0, int64_t b1, int) {
    int64_t r = b0 * kRowBlock;
    const int64_t r_end = std::min(rows, b1 * kRowBlock);
    if (n == 1) {
      for (; r + 8 <= r_end; r += 8) RowsAllInputs<8>(w, r, xp, sp, n, y);
    }
    for (; r + kRowBlock <= r_end; r += kRowBlock) RowsAllInputs<kRowBlock>(w, r, xp, sp, n, y);
    for (; r < r_end; ++r) RowsAllInputs<1>(w, r, xp, sp, n, y);
  });
#else
  const int8_t* q = static_cast<const int8_t*>(w.data);
  const int8_t* xq = qx.data();
  const float* sp = sx.data();  // not sx: thread_local, another thread's in the lambda
  pool.ParallelFor(rows, 16, [&](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r) {
      const int8_t* row = q + r * cols;
      for (int j = 0; j < n; ++j) {
        int32_t dot = 0;
        const int8_t* xr = xq + j * cols;
        for (int64_t k = 0; k < cols; ++k) dot += int32_t{row[k]} * int32_t{xr[k]};
        y[j * rows + r] = sp[j] * w.scales[r] * dot;
      }
    }
  });
#endif
}

}  // namespace recall::kernels::cpu
