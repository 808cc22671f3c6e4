// The int8 panel kernel (kernels/cpu/int8_gemm.h): many inputs against packed weight panels.
#include "kernels/cpu/int8_gemm.h"

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <utility>
#include <vector>

// GCC 12 takes the intrinsics' _mm512_undefined_* operands for uninitialized variables.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#define RECALL_VNNI __attribute__((target("avx512f,avx512bw,avx512vnni")))

namespace recall::kernels::cpu::int8_internal {
namespace {

constexpr int kPanelRows = 32;  // two vectors of 16 rows' int32 sums
// Tile names 12 accumulators (two weight vectors and one broadcast beside them; 8 inputs
// measured slower).
constexpr int kInputs = 6;

// A 16 x 16 transpose of 4-byte elements: r[i] element j becomes r[j] element i.
RECALL_VNNI inline void Transpose16(__m512i (&r)[16]) {
  __m512i t[16];
  for (int p = 0; p < 16; p += 2) {  // pairs of rows interleaved within 128-bit lanes
    t[p] = _mm512_unpacklo_epi32(r[p], r[p + 1]);
    t[p + 1] = _mm512_unpackhi_epi32(r[p], r[p + 1]);
  }
  __m512i u[16];  // u[4q + c], lane L: element 4L + c of rows 4q..4q+3
  for (int q = 0; q < 4; ++q) {
    u[4 * q + 0] = _mm512_unpacklo_epi64(t[4 * q], t[4 * q + 2]);
    u[4 * q + 1] = _mm512_unpackhi_epi64(t[4 * q], t[4 * q + 2]);
    u[4 * q + 2] = _mm512_unpacklo_epi64(t[4 * q + 1], t[4 * q + 3]);
    u[4 * q + 3] = _mm512_unpackhi_epi64(t[4 * q + 1], t[4 * q + 3]);
  }
  for (int c = 0; c < 4; ++c) {  // a 4 x 4 transpose of the lanes of u[c], u[4+c], u[8+c], u[12+c]
    const __m512i v0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44);
    const __m512i v1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xEE);
    const __m512i v2 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44);
    const __m512i v3 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xEE);
    r[c] = _mm512_shuffle_i32x4(v0, v2, 0x88);
    r[4 + c] = _mm512_shuffle_i32x4(v0, v2, 0xDD);
    r[8 + c] = _mm512_shuffle_i32x4(v1, v3, 0x88);
    r[12 + c] = _mm512_shuffle_i32x4(v1, v3, 0xDD);
  }
}

// panel[g][i] (4 bytes each) = row r0 + i, columns 4g..4g+3; zeros past the rows or columns.
// 16 rows x 16 groups at a time through Transpose16, the last groups one by one.
RECALL_VNNI void PackPanel(const int8_t* q, int64_t rows, int64_t cols, int64_t r0, int64_t groups,
                           int32_t* panel) {
  const int64_t live = std::min<int64_t>(kPanelRows, rows - r0);
  const int8_t* src = q + r0 * cols;
  const int64_t chunked = cols / 64 * 16;  // groups in whole 64-byte row chunks
  for (int64_t g = 0; g < chunked; g += 16) {
    for (int h = 0; h < kPanelRows / 16; ++h) {
      __m512i r[16];
      for (int i = 0; i < 16; ++i) {
        const int64_t row = 16 * h + i;
        r[i] = row < live ? _mm512_loadu_si512(src + row * cols + 4 * g) : _mm512_setzero_si512();
      }
      Transpose16(r);
      for (int c = 0; c < 16; ++c) _mm512_storeu_si512(panel + (g + c) * kPanelRows + 16 * h, r[c]);
    }
  }
  for (int64_t g = chunked; g < groups; ++g) {
    const int64_t bytes = std::min<int64_t>(4, cols - 4 * g);
    for (int i = 0; i < kPanelRows; ++i) {
      int32_t four = 0;
      if (i < live) std::memcpy(&four, src + i * cols + 4 * g, static_cast<size_t>(bytes));
      panel[g * kPanelRows + i] = four;
    }
  }
}

// M inputs (xu rows, `stride` apart) against the panel of rows [r0, r0 + 32).
template <int M>
RECALL_VNNI void Tile(const int32_t* panel, int64_t groups, const uint8_t* xu, int64_t stride,
                      const float* sx, const Matrix& w, int64_t r0, float* y) {
  // Named accumulators (an array of them is spilled to the stack by GCC 12).
  __m512i a00 = _mm512_setzero_si512(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00,
          a30 = a00, a31 = a00, a40 = a00, a41 = a00, a50 = a00, a51 = a00;
  const uint8_t* x0 = xu;
  for (int64_t g = 0; g < groups; ++g, x0 += 4) {
    const __m512i w0 = _mm512_loadu_si512(panel + g * kPanelRows);
    const __m512i w1 = _mm512_loadu_si512(panel + g * kPanelRows + 16);
#define RECALL_STEP(J)                             \
  if constexpr (J < M) {                           \
    int32_t four;                                  \
    std::memcpy(&four, x0 + J * stride, 4);        \
    const __m512i b = _mm512_set1_epi32(four);     \
    a##J##0 = _mm512_dpbusd_epi32(a##J##0, b, w0); \
    a##J##1 = _mm512_dpbusd_epi32(a##J##1, b, w1); \
  }
    RECALL_STEP(0) RECALL_STEP(1) RECALL_STEP(2) RECALL_STEP(3) RECALL_STEP(4) RECALL_STEP(5)
#undef RECALL_STEP
  }
  const __m512i acc[6][2] = {{a00, a01}, {a10, a11}, {a20, a21},
                             {a30, a31}, {a40, a41}, {a50, a51}};
  // y = sx * s * (sum - 128 * row_sum): GemvInt8's formula, operation for operation.
  for (int h = 0; h < 2; ++h) {
    const int64_t r = r0 + 16 * h;
    if (r >= w.rows) break;
    const __mmask16 m = static_cast<__mmask16>((1u << std::min<int64_t>(16, w.rows - r)) - 1);
    const __m512 s = _mm512_maskz_loadu_ps(m, w.scales + r);
    const __m512i offset = _mm512_slli_epi32(_mm512_maskz_loadu_epi32(m, w.row_sums + r), 7);
    for (int j = 0; j < M; ++j) {
      const __m512i dot = _mm512_sub_epi32(acc[j][h], offset);
      const __m512 v =
          _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(sx[j]), s), _mm512_cvtepi32_ps(dot));
      _mm512_mask_storeu_ps(y + j * w.rows + r, m, v);
    }
  }
}

using TileFn = void (*)(const int32_t*, int64_t, const uint8_t*, int64_t, const float*,
                        const Matrix&, int64_t, float*);

template <int... M>
constexpr std::array<TileFn, sizeof...(M)> MakeTiles(std::integer_sequence<int, M...>) {
  return {&Tile<M + 1>...};
}

// Tile<m> for m in 1..kInputs, at index m - 1.
constexpr auto kTiles = MakeTiles(std::make_integer_sequence<int, kInputs>{});

}  // namespace

void VnniPanels(ThreadPool& pool, const uint8_t* xu, int64_t stride, const float* sx, int n,
                const Matrix& w, float* y) {
  const int64_t groups = (w.cols + 3) / 4;
  const int64_t blocks = (w.rows + kPanelRows - 1) / kPanelRows;
  const int8_t* q = static_cast<const int8_t*>(w.data);
  pool.ParallelFor(blocks, 1, [&](int64_t b0, int64_t b1, int) {
    thread_local std::vector<int32_t> panel;
    panel.resize(static_cast<size_t>(groups * kPanelRows));
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t r0 = b * kPanelRows;
      PackPanel(q, w.rows, w.cols, r0, groups, panel.data());
      for (int j = 0; j < n; j += kInputs) {
        const int m = std::min(kInputs, n - j);
        kTiles[m - 1](panel.data(), groups, xu + j * stride, stride, sx + j, w, r0, y + j * w.rows);
      }
    }
  });
}

}  // namespace recall::kernels::cpu::int8_internal
