#include "kernels/cpu/gemv.h"

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/convert.h"
#include "kernels/cpu/int8.h"

namespace recall::kernels::cpu {
namespace {

// Vector traits of the widest instruction set the build targets. Each provides the f32
// vector type V, its width kW, and loads that widen f32 / bf16 / f16 weights to V.
#if defined(RECALL_CPU_AVX512)
struct Simd {
  using V = __m512;
  static constexpr int kW = 16;
  static V Zero() { return _mm512_setzero_ps(); }
  static V Fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static float Sum(V v) { return _mm512_reduce_add_ps(v); }
  static V LoadF32(const float* p) { return Load16(p); }
  static V LoadBf16(const uint16_t* p) { return Load16Bf16(p); }
  static V LoadF16(const uint16_t* p) { return Load16F16(p); }
};
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
struct Simd {
  using V = __m256;
  static constexpr int kW = 8;
  static V Zero() { return _mm256_setzero_ps(); }
  static V Fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static float Sum(V v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static V LoadF32(const float* p) { return Load8(p); }
  static V LoadBf16(const uint16_t* p) { return Load8Bf16(p); }
  static V LoadF16(const uint16_t* p) { return Load8F16(p); }
};
#else
#define RECALL_CPU_SCALAR_GEMV 1
#endif

#if !defined(RECALL_CPU_SCALAR_GEMV)
using V = Simd::V;
constexpr int kW = Simd::kW;

template <DType T>
inline V LoadW(const void* w, int64_t i) {
  if constexpr (T == DType::kF32) {
    return Simd::LoadF32(static_cast<const float*>(w) + i);
  } else if constexpr (T == DType::kBF16) {
    return Simd::LoadBf16(static_cast<const uint16_t*>(w) + i);
  } else {
    return Simd::LoadF16(static_cast<const uint16_t*>(w) + i);
  }
}

// y[j, r0 + r] = dot(w[r0 + r, :], x[j, :]) for r < R, j < NB: R weight rows against NB
// inputs with R * NB independent accumulators. Columns past the last full vector are
// added with scalar code. With `prefetch`, the same columns of the next R rows (the next
// memory this thread reads) are prefetched: the hardware prefetchers alone leave
// bandwidth unused with only 4-8 streams per core.
template <DType T, int R, int NB>
inline void Block(const void* w, int64_t rows, int64_t cols, int64_t r0, const float* x, float* y,
                  bool prefetch) {
  V acc[R][NB];
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < NB; ++j) acc[r][j] = Simd::Zero();
  }
  const int64_t full = cols - cols % kW;
  for (int64_t k = 0; k < full; k += kW) {
    V xv[NB];
    for (int j = 0; j < NB; ++j) xv[j] = Simd::LoadF32(x + j * cols + k);
    if (prefetch) {
      for (int r = 0; r < R; ++r) {
        _mm_prefetch(static_cast<const char*>(w) + ((r0 + R + r) * cols + k) * DTypeSize(T),
                     _MM_HINT_T0);
      }
    }
    for (int r = 0; r < R; ++r) {
      const V wv = LoadW<T>(w, (r0 + r) * cols + k);
      for (int j = 0; j < NB; ++j) acc[r][j] = Simd::Fma(wv, xv[j], acc[r][j]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < NB; ++j) {
      float s = Simd::Sum(acc[r][j]);
      for (int64_t k = full; k < cols; ++k) {
        s += LoadAsF32(w, T, (r0 + r) * cols + k) * x[j * cols + k];
      }
      y[j * rows + r0 + r] = s;
    }
  }
}

// Rows [r0, r0 + R) against all n inputs, in groups of up to kGroup inputs; the first
// group prefetches the next rows (later groups find this block's rows in L1).
template <DType T, int R>
inline void RowBlock(const void* w, int64_t rows, int64_t cols, int64_t r0, const float* x, int n,
                     float* y) {
  constexpr int kGroup = R >= 8 ? 2 : 4;
  bool prefetch = r0 + 2 * R <= rows;
  int j = 0;
  for (; j + kGroup <= n; j += kGroup) {
    Block<T, R, kGroup>(w, rows, cols, r0, x + j * cols, y + j * rows, prefetch);
    prefetch = false;
  }
  const float* xj = x + j * cols;
  float* yj = y + j * rows;
  switch (n - j) {
    case 1:
      Block<T, R, 1>(w, rows, cols, r0, xj, yj, prefetch);
      break;
    case 2:
      if constexpr (kGroup > 2) Block<T, R, 2>(w, rows, cols, r0, xj, yj, prefetch);
      break;
    case 3:
      if constexpr (kGroup > 3) Block<T, R, 3>(w, rows, cols, r0, xj, yj, prefetch);
      break;
    default:
      break;
  }
}

template <DType T>
void GemvTyped(ThreadPool& pool, const float* x, int n, const Matrix& w, float* y) {
  // One input streams weights with 8 rows in flight; more inputs use 4 rows so that the
  // accumulators still fit in registers.
  const int64_t rows = w.rows, cols = w.cols;
  constexpr int kRowBlock = 4;
  const int64_t blocks = (rows + kRowBlock - 1) / kRowBlock;
  // Keep at least ~64 KiB of weights per thread so tiny matrices are not split.
  const int64_t min_blocks = std::max<int64_t>(
      1, (int64_t{64} << 10) / std::max<int64_t>(1, kRowBlock * cols * DTypeSize(T)));
  pool.ParallelFor(blocks, min_blocks, [&](int64_t b0, int64_t b1, int) {
    int64_t r = b0 * kRowBlock;
    const int64_t r_end = std::min(rows, b1 * kRowBlock);
    if (n == 1) {
      for (; r + 8 <= r_end; r += 8) RowBlock<T, 8>(w.data, rows, cols, r, x, n, y);
    }
    for (; r + kRowBlock <= r_end; r += kRowBlock) {
      RowBlock<T, kRowBlock>(w.data, rows, cols, r, x, n, y);
    }
    for (; r < r_end; ++r) RowBlock<T, 1>(w.data, rows, cols, r, x, n, y);
  });
}
#endif  // !RECALL_CPU_SCALAR_GEMV

}  // namespace

void Gemv(ThreadPool& pool, const float* x, int n, const Matrix& w, float* y) {
  if (w.dtype == DType::kI8) {
    GemvInt8(pool, x, n, w, y);
    return;
  }
#if defined(RECALL_CPU_SCALAR_GEMV)
  const int64_t rows = w.rows, cols = w.cols;
  pool.ParallelFor(rows, 16, [&](int64_t r0, int64_t r1, int) {
    for (int64_t r = r0; r < r1; ++r) {
      for (int j = 0; j < n; ++j) {
        float s = 0.0f;
        for (int64_t k = 0; k < cols; ++k) {
          s += LoadAsF32(w.data, w.dtype, r * cols + k) * x[j * cols + k];
        }
        y[j * rows + r] = s;
      }
    }
  });
#else
  switch (w.dtype) {
    case DType::kF32:
      GemvTyped<DType::kF32>(pool, x, n, w, y);
      break;
    case DType::kBF16:
      GemvTyped<DType::kBF16>(pool, x, n, w, y);
      break;
    case DType::kF16:
      GemvTyped<DType::kF16>(pool, x, n, w, y);
      break;
    case DType::kI8:
    case DType::kF8E4M3:  // never here: CpuBackend refuses FP8 weights
      break;  // above
  }
#endif
}

}  // namespace recall::kernels::cpu
