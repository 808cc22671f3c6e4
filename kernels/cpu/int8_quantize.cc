// Int8 quantization of rows (kernels/cpu/int8.h): no threads, no SIMD, so the loaders' fuzz
// build can link it beside the model code.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/int8.h"

namespace recall::kernels::cpu {
namespace {

// Quantizes one row; returns its scale.
float QuantizeRow(const float* x, int64_t cols, int8_t* q) {
  float amax = 0.0f;
  bool finite = true;
  for (int64_t k = 0; k < cols; ++k) {
    finite &= std::isfinite(x[k]);
    amax = std::max(amax, std::fabs(x[k]));
  }
  if (!finite || amax == 0.0f) {
    // Zeros; a row holding inf or NaN, which no scale represents, gets a NaN scale, so the
    // products show it as the fp32 ones would.
    if (cols > 0) std::memset(q, 0, static_cast<size_t>(cols));
    return finite ? 0.0f : std::nanf("");
  }
  const float s = amax / 127.0f;
  const float inv = 127.0f / amax;
  for (int64_t k = 0; k < cols; ++k) {
    const float v = std::nearbyint(x[k] * inv);
    q[k] = static_cast<int8_t>(std::clamp(v, -127.0f, 127.0f));
  }
  return s;
}

}  // namespace

void QuantizeRowsInt8(const float* w, int64_t rows, int64_t cols, int8_t* q, float* scales,
                      int32_t* row_sums) {
  for (int64_t r = 0; r < rows; ++r) {
    scales[r] = QuantizeRow(w + r * cols, cols, q + r * cols);
    if (row_sums == nullptr) continue;
    int32_t sum = 0;
    for (int64_t k = 0; k < cols; ++k) sum += q[r * cols + k];
    row_sums[r] = sum;
  }
}

void DequantizeRowsInt8(const Matrix& w, int64_t r0, int64_t n, float* dst) {
  const int8_t* q = static_cast<const int8_t*>(w.data);
  for (int64_t r = 0; r < n; ++r) {
    const float s = w.scales[r0 + r];
    const int8_t* row = q + (r0 + r) * w.cols;
    float* out = dst + r * w.cols;
    for (int64_t k = 0; k < w.cols; ++k) out[k] = static_cast<float>(row[k]) * s;
  }
}

}  // namespace recall::kernels::cpu
