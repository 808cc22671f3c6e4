// Plain-loop references and test data helpers for the kernel tests. Written independently
// of the kernels (own bf16/f16 decoding, contiguous KV) so that the two can disagree.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/tensor.h"

namespace recall::kernels::testing {

inline float RefBf16(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// IEEE half -> float by its definition (normals and subnormals; no inf/nan here).
inline float RefF16(uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 31, mant = h & 1023;
  double v = exp == 0 ? std::ldexp(mant / 1024.0, -14) : std::ldexp(1.0 + mant / 1024.0, exp - 15);
  return static_cast<float>(sign ? -v : v);
}

// A weight matrix in any dtype plus its f32 values as the reference sees them.
struct TestMatrix {
  std::vector<uint8_t> storage;
  std::vector<float> values;  // [rows, cols] f32
  Matrix m;
};

inline TestMatrix RandomMatrix(DType dtype, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
  TestMatrix t;
  const int64_t count = rows * cols;
  t.values.resize(count);
  t.storage.resize(count * DTypeSize(dtype));
  for (int64_t i = 0; i < count; ++i) {
    if (dtype == DType::kF32) {
      t.values[i] = uni(rng);
      std::memcpy(t.storage.data() + i * 4, &t.values[i], 4);
      continue;
    }
    uint16_t h;
    if (dtype == DType::kBF16) {
      const float f = uni(rng);
      uint32_t bits;
      std::memcpy(&bits, &f, 4);
      h = static_cast<uint16_t>(bits >> 16);
      t.values[i] = RefBf16(h);
    } else {
      // Sign, exponent 10..16 (magnitudes 2^-5 .. 2^2), random mantissa; sometimes subnormal.
      const uint32_t r = rng();
      const uint16_t exp = (r % 17 == 0) ? 0 : 10 + (r >> 8) % 7;
      h = static_cast<uint16_t>(((r >> 4) & 1) << 15 | exp << 10 | ((r >> 12) & 1023));
      t.values[i] = RefF16(h);
    }
    std::memcpy(t.storage.data() + i * 2, &h, 2);
  }
  t.m = Matrix{t.storage.data(), dtype, rows, cols};
  return t;
}

inline std::vector<float> RandomVector(int64_t n, uint32_t seed, float lo = -1.0f,
                                       float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uni(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = uni(rng);
  return v;
}

// llama2.c run.c softmax.
inline void RefSoftmax(float* x, int n) {
  float max_val = x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] > max_val) max_val = x[i];
  }
  float sum = 0.0f;
  for (int i = 0; i < n; ++i) {
    x[i] = expf(x[i] - max_val);
    sum += x[i];
  }
  for (int i = 0; i < n; ++i) x[i] /= sum;
}

// Attention of one query over contiguous keys/values [len, hd], in double.
inline std::vector<double> RefAttend(const float* q, const std::vector<const float*>& keys,
                                     const std::vector<const float*>& values, int hd, float scale,
                                     std::vector<double>* probs) {
  const size_t len = keys.size();
  std::vector<double> s(len), out(hd, 0.0);
  double mx = -1e300;
  for (size_t t = 0; t < len; ++t) {
    double d = 0;
    for (int i = 0; i < hd; ++i) d += static_cast<double>(q[i]) * keys[t][i];
    s[t] = d * scale;
    mx = std::max(mx, s[t]);
  }
  double sum = 0;
  for (double& x : s) sum += (x = std::exp(x - mx));
  for (double& x : s) x /= sum;
  for (size_t t = 0; t < len; ++t) {
    for (int i = 0; i < hd; ++i) out[i] += s[t] * values[t][i];
  }
  if (probs != nullptr) *probs = s;
  return out;
}

}  // namespace recall::kernels::testing
