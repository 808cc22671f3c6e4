#include "kernels/kv_rows.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/half.h"

namespace recall::kernels {

void EncodeKvRow(KvDType dtype, const float* x, int n, void* data, float* scale) {
  switch (dtype) {
    case KvDType::kF32:
      std::memcpy(data, x, static_cast<size_t>(n) * sizeof(float));
      return;
    case KvDType::kBF16: {
      uint16_t* out = static_cast<uint16_t*>(data);
      for (int i = 0; i < n; ++i) out[i] = F32ToBf16(x[i]);
      return;
    }
    case KvDType::kF16: {
      uint16_t* out = static_cast<uint16_t*>(data);
      for (int i = 0; i < n; ++i) out[i] = F32ToF16(std::clamp(x[i], -65504.0f, 65504.0f));
      return;
    }
    case KvDType::kInt8: {
      float max_abs = 0.0f;
      for (int i = 0; i < n; ++i) max_abs = std::max(max_abs, std::fabs(x[i]));
      const float s = max_abs / 127.0f;
      *scale = s;
      int8_t* out = static_cast<int8_t*>(data);
      const float inv = s > 0.0f ? 1.0f / s : 0.0f;
      for (int i = 0; i < n; ++i) {
        out[i] = static_cast<int8_t>(std::clamp(std::nearbyint(x[i] * inv), -127.0f, 127.0f));
      }
      return;
    }
  }
}

void DecodeKvRow(KvDType dtype, const void* data, float scale, int n, float* out) {
  switch (dtype) {
    case KvDType::kF32:
      std::memcpy(out, data, static_cast<size_t>(n) * sizeof(float));
      return;
    case KvDType::kBF16: {
      const uint16_t* in = static_cast<const uint16_t*>(data);
      for (int i = 0; i < n; ++i) out[i] = Bf16ToF32(in[i]);
      return;
    }
    case KvDType::kF16: {
      const uint16_t* in = static_cast<const uint16_t*>(data);
      for (int i = 0; i < n; ++i) out[i] = F16ToF32(in[i]);
      return;
    }
    case KvDType::kInt8: {
      const int8_t* in = static_cast<const int8_t*>(data);
      for (int i = 0; i < n; ++i) out[i] = static_cast<float>(in[i]) * scale;
      return;
    }
  }
}

void StoreKvRow(const PagedKvHead& head, int is_v, int slot, const float* x) {
  float scale = 0.0f;
  EncodeKvRow(head.dtype, x, head.head_dim, head.RowData(is_v, slot), &scale);
  if (head.dtype == KvDType::kInt8) *head.RowScale(is_v, slot) = scale;
}

void LoadKvRow(const PagedKvHead& head, int is_v, int slot, float* out) {
  const float scale = head.dtype == KvDType::kInt8 ? *head.RowScale(is_v, slot) : 1.0f;
  DecodeKvRow(head.dtype, head.RowData(is_v, slot), scale, head.head_dim, out);
}

}  // namespace recall::kernels
