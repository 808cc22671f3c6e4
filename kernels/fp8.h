// E4M3FN, the 8-bit float of FP8 checkpoints (1 sign bit, 4 exponent bits biased by 7, 3
// mantissa bits; no infinities, 0x7F and 0xFF are NaN, the largest finite value is 448), and
// the layout of a matrix kept in it (DType::kF8E4M3, kernels/tensor.h).
#pragma once

#include <cmath>
#include <cstdint>

namespace recall::kernels {

// The value of one E4M3FN byte (NaN for 0x7F and 0xFF). Every value is exact in fp32.
inline float E4M3ToF32(uint8_t code) {
  const float sign = (code & 0x80) ? -1.0f : 1.0f;
  const int exponent = (code >> 3) & 0xF;
  const int mantissa = code & 0x7;
  if (exponent == 0xF && mantissa == 0x7) return std::nanf("");
  if (exponent == 0) return sign * std::ldexp(static_cast<float>(mantissa), -9);  // subnormal
  return sign * std::ldexp(1.0f + static_cast<float>(mantissa) / 8.0f, exponent - 7);
}

// The E4M3FN byte nearest to x (round to nearest, ties to even; |x| above 448 saturates to
// +-448; NaN gives 0x7F).
inline uint8_t F32ToE4M3(float x) {
  if (std::isnan(x)) return 0x7F;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const float a = std::fabs(x);
  if (a >= 448.0f) return sign | 0x7E;
  int e = 0;
  const float f = std::frexp(a, &e);  // a = f * 2^e, 0.5 <= f < 1 (or a == 0)
  if (a == 0.0f) return sign;
  const int u = e - 1;  // a = (2f) * 2^u
  if (u < -6) {         // subnormal: m * 2^-9, m = 8 is the smallest normal's code
    return sign | static_cast<uint8_t>(std::nearbyint(a * 512.0f));
  }
  int m = static_cast<int>(std::nearbyint((2.0f * f - 1.0f) * 8.0f));
  int biased = u + 7;
  if (m == 8) m = 0, ++biased;
  if (biased > 15 || (biased == 15 && m == 7)) return sign | 0x7E;
  return sign | static_cast<uint8_t>((biased << 3) | m);
}

}  // namespace recall::kernels
