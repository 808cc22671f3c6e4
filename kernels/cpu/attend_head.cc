#include "kernels/cpu/attend_head.h"

#include <algorithm>
#include <vector>

#include "kernels/cpu/convert.h"
#include "kernels/cpu/elementwise.h"
#include "kernels/cpu/simd_math.h"
#include "kernels/kv_rows.h"

namespace recall::kernels::cpu {
namespace {

inline float Dot(const float* a, const float* b, int n) {
  int i = 0;
  float s = 0.0f;
#if defined(__AVX2__) && defined(__FMA__)
  if (n >= 8) {
    __m256 acc = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(Load8(a + i), Load8(b + i), acc);
    __m128 r = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    s = _mm_cvtss_f32(r);
  }
#endif
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// The portable kernel: run.c's loops. Rows of other types than fp32 are widened first.
void AttendHeadGeneric(const PagedKvHead& kv, int len, const float* q, float scale, float* p,
                       float* out) {
  const int hd = kv.head_dim;
  const int bt = kv.block_tokens;
  if (kv.dtype != KvDType::kF32) {
    thread_local std::vector<float> row;
    row.resize(static_cast<size_t>(hd));
    for (int s = 0; s < len; ++s) {
      LoadKvRow(kv, 0, s, row.data());
      p[s] = Dot(q, row.data(), hd) * scale;
    }
    SoftmaxRow(p, len);
    std::fill(out, out + hd, 0.0f);
    for (int s = 0; s < len; ++s) {
      LoadKvRow(kv, 1, s, row.data());
      for (int i = 0; i < hd; ++i) out[i] += p[s] * row[i];
    }
    return;
  }
  for (int s0 = 0; s0 < len; s0 += bt) {
    const float* k = kv.K(s0);
    const int cnt = std::min(bt, len - s0);
    for (int r = 0; r < cnt; ++r) p[s0 + r] = Dot(q, k + r * hd, hd) * scale;
  }
  SoftmaxRow(p, len);
  std::fill(out, out + hd, 0.0f);
  for (int s0 = 0; s0 < len; s0 += bt) {
    const float* v = kv.V(s0);
    const int cnt = std::min(bt, len - s0);
    for (int r = 0; r < cnt; ++r) {
      const float a = p[s0 + r];
      const float* vr = v + r * hd;
      for (int i = 0; i < hd; ++i) out[i] += a * vr[i];
    }
  }
}

#if defined(RECALL_CPU_AVX512)
constexpr int kGroup = 16;  // keys per group: one zmm of scores

inline __mmask16 FirstLanes(int n) {
  return n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1);
}

// rows[j] = the K (is_v = 0) or V row of slot s0 + min(j, cnt - 1) of the head, for j < 16,
// and (int8) scales[j] its scale: one group of keys, padded by repeating the last row.
// REQUIRES: 1 <= cnt <= 16.
inline void GroupRows(const PagedKvHead& kv, int is_v, int s0, int cnt, const uint8_t** rows,
                      float* scales) {
  const int bt = kv.block_tokens;
  const int64_t rb = kv.row_bytes();
  const bool scaled = kv.dtype == KvDType::kInt8;
  int in_block = s0 % bt;
  const uint8_t* row = kv.RowData(is_v, s0);
  const float* scale = scaled ? kv.RowScale(is_v, s0) : nullptr;
  for (int j = 0; j < kGroup; ++j) {
    rows[j] = row;
    if (scaled) scales[j] = *scale;
    if (j + 1 < cnt) {
      if (++in_block == bt) {
        in_block = 0;
        row = kv.RowData(is_v, s0 + j + 1);
        if (scaled) scale = kv.RowScale(is_v, s0 + j + 1);
      } else {
        row += rb;
        if (scaled) ++scale;
      }
    }
  }
}

// Sixteen elements (chunk c) of a row of type T, widened to fp32 (int8: unscaled).
template <KvDType T>
inline __m512 LoadRow16(const uint8_t* row, int c, __mmask16 m) {
  if constexpr (T == KvDType::kF32) {
    return Load16(reinterpret_cast<const float*>(row) + 16 * c, m);
  } else if constexpr (T == KvDType::kBF16) {
    return Load16Bf16(reinterpret_cast<const uint16_t*>(row) + 16 * c, m);
  } else if constexpr (T == KvDType::kF16) {
    return Load16F16(reinterpret_cast<const uint16_t*>(row) + 16 * c, m);
  } else {
    const __m128i b = _mm_maskz_loadu_epi8(m, row + 16 * c);
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
  }
}

// Lane j of the result = the sum of the lanes of v[j] (16 horizontal sums in 45 ops).
inline __m512 Transpose16Sum(const __m512* v) {
  __m512 t[8], u[4], w[2];
#pragma GCC unroll 8
  for (int i = 0; i < 8; ++i) {
    t[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                         _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  }
#pragma GCC unroll 8
  for (int i = 0; i < 4; ++i) {
    u[i] = _mm512_add_ps(_mm512_shuffle_ps(t[2 * i], t[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_ps(t[2 * i], t[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
  }
#pragma GCC unroll 8
  for (int i = 0; i < 2; ++i) {
    w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(u[2 * i], u[2 * i + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  }
  return _mm512_add_ps(_mm512_shuffle_f32x4(w[0], w[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_f32x4(w[0], w[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

// Softmax of p[0, len) in place: subtract the max, exp, divide by the sum.
inline void SoftmaxInPlace(float* p, int len) {
  __m512 mx = _mm512_set1_ps(-3.402823466e38f);
  for (int i = 0; i < len; i += 16) {
    mx = _mm512_mask_max_ps(mx, FirstLanes(len - i), mx,
                            _mm512_maskz_loadu_ps(FirstLanes(len - i), p + i));
  }
  const __m512 vmax = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
  __m512 sum = _mm512_setzero_ps();
  for (int i = 0; i < len; i += 16) {
    const __mmask16 m = FirstLanes(len - i);
    const __m512 e =
        _mm512_maskz_mov_ps(m, Exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, p + i), vmax)));
    _mm512_mask_storeu_ps(p + i, m, e);
    sum = _mm512_add_ps(sum, e);
  }
  const __m512 vsum = _mm512_set1_ps(_mm512_reduce_add_ps(sum));
  for (int i = 0; i < len; i += 16) {
    const __mmask16 m = FirstLanes(len - i);
    _mm512_mask_storeu_ps(p + i, m, _mm512_div_ps(_mm512_maskz_loadu_ps(m, p + i), vsum));
  }
}

// NC = head_dim / 16 rounded up; the last chunk is masked by `tail`. T: the rows' type; an
// int8 row's scale multiplies its score (K) and its weight (V).
template <KvDType T, int NC>
void AttendHeadAvx512(const PagedKvHead& kv, int len, const float* q, float scale, float* p,
                      float* out) {
  const __mmask16 tail = FirstLanes(kv.head_dim - 16 * (NC - 1));
  auto mask = [tail](int c) { return c == NC - 1 ? tail : __mmask16(0xFFFF); };
  __m512 qv[NC];
#pragma GCC unroll 8
  for (int c = 0; c < NC; ++c) qv[c] = Load16(q + 16 * c, mask(c));

  // Scores, 16 keys per group; rows past len repeat the last key and are not stored.
  const __m512 vscale = _mm512_set1_ps(scale);
  const uint8_t* rows[kGroup];
  alignas(64) float scales[kGroup];
  for (int s0 = 0; s0 < len; s0 += kGroup) {
    const int cnt = std::min(kGroup, len - s0);
    GroupRows(kv, 0, s0, cnt, rows, scales);
    __m512 acc[kGroup];
#pragma GCC unroll 16
    for (int j = 0; j < kGroup; ++j) {
      __m512 a = _mm512_mul_ps(qv[0], LoadRow16<T>(rows[j], 0, mask(0)));
#pragma GCC unroll 8
      for (int c = 1; c < NC; ++c) {
        a = _mm512_fmadd_ps(qv[c], LoadRow16<T>(rows[j], c, mask(c)), a);
      }
      acc[j] = a;
    }
    __m512 dots = _mm512_mul_ps(Transpose16Sum(acc), vscale);
    if constexpr (T == KvDType::kInt8) dots = _mm512_mul_ps(dots, _mm512_load_ps(scales));
    _mm512_mask_storeu_ps(p + s0, FirstLanes(cnt), dots);
  }

  SoftmaxInPlace(p, len);

  // out = sum_s p[s] V[s], even and odd slots in separate accumulators; padding rows of a
  // group get weight 0.
  __m512 oa[NC], ob[NC];
#pragma GCC unroll 8
  for (int c = 0; c < NC; ++c) oa[c] = ob[c] = _mm512_setzero_ps();
  for (int s0 = 0; s0 < len; s0 += kGroup) {
    const int cnt = std::min(kGroup, len - s0);
    GroupRows(kv, 1, s0, cnt, rows, scales);
    __m512 pv = _mm512_maskz_loadu_ps(FirstLanes(cnt), p + s0);
    if constexpr (T == KvDType::kInt8) pv = _mm512_mul_ps(pv, _mm512_load_ps(scales));
    alignas(64) float w[kGroup];
    _mm512_store_ps(w, pv);
#pragma GCC unroll 16
    for (int j = 0; j < kGroup; j += 2) {
      const __m512 pa = _mm512_set1_ps(w[j]), pb = _mm512_set1_ps(w[j + 1]);
#pragma GCC unroll 8
      for (int c = 0; c < NC; ++c) {
        oa[c] = _mm512_fmadd_ps(pa, LoadRow16<T>(rows[j], c, mask(c)), oa[c]);
        ob[c] = _mm512_fmadd_ps(pb, LoadRow16<T>(rows[j + 1], c, mask(c)), ob[c]);
      }
    }
  }
#pragma GCC unroll 8
  for (int c = 0; c < NC; ++c) {
    _mm512_mask_storeu_ps(out + 16 * c, mask(c), _mm512_add_ps(oa[c], ob[c]));
  }
}
// bf16 rows, head_dim = 32 * NP: 32 elements are one 512-bit load of 16 lanes, each lane a
// pair (even element in its low half, odd in its high half). Widening is one op per half
// (the even element: lane << 16; the odd: lane & 0xFFFF0000), so the scores take the query
// split into its even and odd elements, and V accumulates even and odd elements apart,
// interleaved at the end. About half the widening work of LoadRow16<kBF16>.
template <int NP>
void AttendHeadBf16Pairs(const PagedKvHead& kv, int len, const float* q, float scale, float* p,
                         float* out) {
  const __m512i hi_mask = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  auto even = [](__m512i x) { return _mm512_castsi512_ps(_mm512_slli_epi32(x, 16)); };
  auto odd = [&](__m512i x) { return _mm512_castsi512_ps(_mm512_and_si512(x, hi_mask)); };
  auto load = [](const uint8_t* row, int c) {
    return _mm512_loadu_si512(reinterpret_cast<const void*>(row + 64 * c));
  };
  alignas(64) float qe[16 * NP], qo[16 * NP];
  for (int i = 0; i < 16 * NP; ++i) {
    qe[i] = q[2 * i];
    qo[i] = q[2 * i + 1];
  }
  __m512 qev[NP], qov[NP];
#pragma GCC unroll 4
  for (int c = 0; c < NP; ++c) {
    qev[c] = _mm512_load_ps(qe + 16 * c);
    qov[c] = _mm512_load_ps(qo + 16 * c);
  }
  const __m512 vscale = _mm512_set1_ps(scale);
  const uint8_t* rows[kGroup];
  alignas(64) float unused[kGroup];
  for (int s0 = 0; s0 < len; s0 += kGroup) {
    const int cnt = std::min(kGroup, len - s0);
    GroupRows(kv, 0, s0, cnt, rows, unused);
    __m512 acc[kGroup];
#pragma GCC unroll 16
    for (int j = 0; j < kGroup; ++j) {
      const __m512i x0 = load(rows[j], 0);
      __m512 a = _mm512_fmadd_ps(qov[0], odd(x0), _mm512_mul_ps(qev[0], even(x0)));
#pragma GCC unroll 4
      for (int c = 1; c < NP; ++c) {
        const __m512i x = load(rows[j], c);
        a = _mm512_fmadd_ps(qev[c], even(x), a);
        a = _mm512_fmadd_ps(qov[c], odd(x), a);
      }
      acc[j] = a;
    }
    _mm512_mask_storeu_ps(p + s0, FirstLanes(cnt), _mm512_mul_ps(Transpose16Sum(acc), vscale));
  }

  SoftmaxInPlace(p, len);

  __m512 oe[NP], oo[NP];
#pragma GCC unroll 4
  for (int c = 0; c < NP; ++c) oe[c] = oo[c] = _mm512_setzero_ps();
  for (int s0 = 0; s0 < len; s0 += kGroup) {
    const int cnt = std::min(kGroup, len - s0);
    GroupRows(kv, 1, s0, cnt, rows, unused);
    alignas(64) float w[kGroup];
    _mm512_store_ps(w, _mm512_maskz_loadu_ps(FirstLanes(cnt), p + s0));
#pragma GCC unroll 16
    for (int j = 0; j < kGroup; ++j) {
      const __m512 pj = _mm512_set1_ps(w[j]);
#pragma GCC unroll 4
      for (int c = 0; c < NP; ++c) {
        const __m512i x = load(rows[j], c);
        oe[c] = _mm512_fmadd_ps(pj, even(x), oe[c]);
        oo[c] = _mm512_fmadd_ps(pj, odd(x), oo[c]);
      }
    }
  }
  alignas(64) float e[16 * NP], o[16 * NP];
#pragma GCC unroll 4
  for (int c = 0; c < NP; ++c) {
    _mm512_store_ps(e + 16 * c, oe[c]);
    _mm512_store_ps(o + 16 * c, oo[c]);
  }
  for (int i = 0; i < 16 * NP; ++i) {
    out[2 * i] = e[i];
    out[2 * i + 1] = o[i];
  }
}

// AttendHeadAvx512 for head_dim <= 128; false for larger heads.
template <KvDType T>
bool AttendHeadSimd(const PagedKvHead& kv, int len, const float* q, float scale, float* p,
                    float* out) {
  switch ((kv.head_dim + 15) / 16) {
    case 1:
      AttendHeadAvx512<T, 1>(kv, len, q, scale, p, out);
      return true;
    case 2:
      AttendHeadAvx512<T, 2>(kv, len, q, scale, p, out);
      return true;
    case 3:
      AttendHeadAvx512<T, 3>(kv, len, q, scale, p, out);
      return true;
    case 4:
      AttendHeadAvx512<T, 4>(kv, len, q, scale, p, out);
      return true;
    case 5:
      AttendHeadAvx512<T, 5>(kv, len, q, scale, p, out);
      return true;
    case 6:
      AttendHeadAvx512<T, 6>(kv, len, q, scale, p, out);
      return true;
    case 7:
      AttendHeadAvx512<T, 7>(kv, len, q, scale, p, out);
      return true;
    case 8:
      AttendHeadAvx512<T, 8>(kv, len, q, scale, p, out);
      return true;
    default:
      return false;
  }
}
#endif  // RECALL_CPU_AVX512

}  // namespace

void AttendHead(const PagedKvHead& kv, int len, const float* q, float scale, float* p,
                float* out) {
  const int hd = kv.head_dim;
  if (len <= 0) {
    std::fill(out, out + hd, 0.0f);
    return;
  }
#if defined(RECALL_CPU_AVX512)
  switch (kv.dtype) {
    case KvDType::kF32:
      if (AttendHeadSimd<KvDType::kF32>(kv, len, q, scale, p, out)) return;
      break;
    case KvDType::kBF16:
      switch (hd) {
        case 32:
          return AttendHeadBf16Pairs<1>(kv, len, q, scale, p, out);
        case 64:
          return AttendHeadBf16Pairs<2>(kv, len, q, scale, p, out);
        case 96:
          return AttendHeadBf16Pairs<3>(kv, len, q, scale, p, out);
        case 128:
          return AttendHeadBf16Pairs<4>(kv, len, q, scale, p, out);
      }
      if (AttendHeadSimd<KvDType::kBF16>(kv, len, q, scale, p, out)) return;
      break;
    case KvDType::kF16:
      if (AttendHeadSimd<KvDType::kF16>(kv, len, q, scale, p, out)) return;
      break;
    case KvDType::kInt8:
      if (AttendHeadSimd<KvDType::kInt8>(kv, len, q, scale, p, out)) return;
      break;
  }
#endif
  AttendHeadGeneric(kv, len, q, scale, p, out);
}

}  // namespace recall::kernels::cpu
