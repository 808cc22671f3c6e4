// Element conversions for weights stored as bf16 or f16, scalar and SIMD.
// bf16 is the top 16 bits of an IEEE f32, so widening is a 16-bit shift; f16 uses F16C.
// The SIMD loaders exist only when the build targets the matching instruction set.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__AVX2__) || defined(__AVX512F__) || defined(__F16C__)
// GCC 12's AVX-512 headers trip -W(maybe-)uninitialized on their own _mm512_undefined_*
// placeholders (GCC bug 105593); the diagnostic points into the header, so silence it there.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif

#include "kernels/fp8.h"
#include "kernels/tensor.h"

namespace recall::kernels::cpu {

inline float Bf16ToF32(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

inline float F16ToF32(uint16_t h) {
#if defined(__F16C__)
  return _cvtsh_ss(h);
#else
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {  // inf / nan
    bits = sign | 0x7f800000u | (mant << 13);
  } else if (exp != 0) {  // normal
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {  // zero
    bits = sign;
  } else {  // subnormal: renormalise
    exp = 113;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
#endif
}

// Element i of a matrix stored with dtype t, as f32 (kI8: the integer, without its row's
// scale; kF8E4M3: the code's value, without its block's scale).
inline float LoadAsF32(const void* data, DType t, int64_t i) {
  switch (t) {
    case DType::kI8:
      return static_cast<float>(static_cast<const int8_t*>(data)[i]);
    case DType::kF8E4M3:
      return E4M3ToF32(static_cast<const uint8_t*>(data)[i]);
    case DType::kF32:
      return static_cast<const float*>(data)[i];
    case DType::kF16:
      return F16ToF32(static_cast<const uint16_t*>(data)[i]);
    case DType::kBF16:
      return Bf16ToF32(static_cast<const uint16_t*>(data)[i]);
  }
  return 0.0f;
}

// dst[0, count) = src[0, count) widened to f32. src points at the first element. kI8: the
// integers, without the rows' scales (DequantizeRowsInt8 applies them).
void ConvertToF32(const void* src, DType t, int64_t count, float* dst);

#if defined(__AVX2__) && defined(__F16C__)
inline __m256 Load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 Load8Bf16(const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
inline __m256 Load8F16(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
#endif

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define RECALL_CPU_AVX512 1
inline __m512 Load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 Load16Bf16(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline __m512 Load16F16(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
// Masked variants for row tails: lanes outside mask read as 0 and touch no memory.
inline __m512 Load16(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 Load16Bf16(const uint16_t* p, __mmask16 m) {
  const __m256i h = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
inline __m512 Load16F16(const uint16_t* p, __mmask16 m) {
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
}
#endif

}  // namespace recall::kernels::cpu
