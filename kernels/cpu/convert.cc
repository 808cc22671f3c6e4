#include "kernels/cpu/convert.h"

namespace recall::kernels::cpu {

void ConvertToF32(const void* src, DType t, int64_t count, float* dst) {
  if (t == DType::kF32) {
    std::memcpy(dst, src, static_cast<size_t>(count) * sizeof(float));
    return;
  }
  if (t == DType::kI8) {
    const int8_t* q = static_cast<const int8_t*>(src);
    for (int64_t i = 0; i < count; ++i) dst[i] = static_cast<float>(q[i]);
    return;
  }
  if (t == DType::kF8E4M3) {
    const uint8_t* q = static_cast<const uint8_t*>(src);
    for (int64_t i = 0; i < count; ++i) dst[i] = E4M3ToF32(q[i]);
    return;
  }
  const uint16_t* h = static_cast<const uint16_t*>(src);
  int64_t i = 0;
#if defined(RECALL_CPU_AVX512)
  if (t == DType::kBF16) {
    for (; i + 16 <= count; i += 16) _mm512_storeu_ps(dst + i, Load16Bf16(h + i));
  } else {
    for (; i + 16 <= count; i += 16) _mm512_storeu_ps(dst + i, Load16F16(h + i));
  }
#elif defined(__AVX2__) && defined(__F16C__)
  if (t == DType::kBF16) {
    for (; i + 8 <= count; i += 8) _mm256_storeu_ps(dst + i, Load8Bf16(h + i));
  } else {
    for (; i + 8 <= count; i += 8) _mm256_storeu_ps(dst + i, Load8F16(h + i));
  }
#endif
  if (t == DType::kBF16) {
    for (; i < count; ++i) dst[i] = Bf16ToF32(h[i]);
  } else {
    for (; i < count; ++i) dst[i] = F16ToF32(h[i]);
  }
}

}  // namespace recall::kernels::cpu
