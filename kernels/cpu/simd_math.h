// Vector exp for the hot softmax and SiluMul loops. Cody-Waite range reduction
// (x = n ln2 + r, |r| <= ln2 / 2) and Cephes' degree-5 minimax polynomial for exp(r):
// within 2 ulp of the correctly rounded expf over the whole float range it is used on
// (tests/kernels/simd_math_test.cc). Inputs are clamped to [-87.3, 88.7]: results below
// ~1e-38 flush to the smallest normal range, above overflow saturate at ~FLT_MAX.
#pragma once

#include "kernels/cpu/convert.h"  // immintrin.h, RECALL_CPU_AVX512

namespace recall::kernels::cpu {

namespace exp_constants {
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f;
constexpr float kLn2Lo = -2.12194440e-4f;
constexpr float kMin = -87.3f;
constexpr float kMax = 88.7f;
constexpr float kP0 = 1.9875691500e-4f;
constexpr float kP1 = 1.3981999507e-3f;
constexpr float kP2 = 8.3334519073e-3f;
constexpr float kP3 = 4.1665795894e-2f;
constexpr float kP4 = 1.6666665459e-1f;
constexpr float kP5 = 5.0000001201e-1f;
}  // namespace exp_constants

#if defined(RECALL_CPU_AVX512)
inline __m512 Exp16(__m512 x) {
  using namespace exp_constants;
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(kMin)), _mm512_set1_ps(kMax));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  __m512 p = _mm512_set1_ps(kP0);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP1));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP2));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP3));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP4));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP5));
  const __m512 r2 = _mm512_mul_ps(r, r);
  const __m512 y = _mm512_add_ps(_mm512_fmadd_ps(p, r2, r), _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(y, n);
}
#endif

#if defined(__AVX2__) && defined(__FMA__)
inline __m256 Exp8(__m256 x) {
  using namespace exp_constants;
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(kMin)), _mm256_set1_ps(kMax));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kP0);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP1));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP2));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP3));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP4));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP5));
  const __m256 r2 = _mm256_mul_ps(r, r);
  const __m256 y = _mm256_add_ps(_mm256_fmadd_ps(p, r2, r), _mm256_set1_ps(1.0f));
  // 2^n through the exponent field; n is within [-126, 128] after the clamp, and 2^128 is
  // split as 2^127 * 2 so that the largest inputs do not overflow the field.
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i half = _mm256_srai_epi32(ni, 1);
  const __m256 s1 =
      _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, _mm256_set1_epi32(127)), 23));
  const __m256 s2 = _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, half), _mm256_set1_epi32(127)), 23));
  return _mm256_mul_ps(_mm256_mul_ps(y, s1), s2);
}
#endif

}  // namespace recall::kernels::cpu
