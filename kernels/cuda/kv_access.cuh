// Device access to typed KV rows (kernels/tensor.h KvDType and PagedKvLayout): where a row
// and its scale are, one element widened to fp32, and a row written with the KV store's
// rounding (the device twin of kernels/kv_rows.h). Row bytes are a multiple of 4 (head_dim
// % 4 == 0 for every type), so rows move as 32-bit words.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/tensor.h"

namespace recall::kernels::cuda {

// Byte offset from the pool's base of the row of `slot` (in block `block`) of KV head h.
__device__ inline int64_t KvRowOffset(const PagedKvLayout& l, int32_t block, int h, int is_v,
                                      int slot) {
  return static_cast<int64_t>(block) * l.BlockBytes() + l.PlaneOffset(h, is_v) + l.ScaleBytes() +
         static_cast<int64_t>(slot % l.block_tokens) * l.RowBytes();
}
// Byte offset of its scale (kInt8 only).
__device__ inline int64_t KvScaleOffset(const PagedKvLayout& l, int32_t block, int h, int is_v,
                                        int slot) {
  return static_cast<int64_t>(block) * l.BlockBytes() + l.PlaneOffset(h, is_v) +
         static_cast<int64_t>(slot % l.block_tokens) * 4;
}
// The row's scale: its stored one for kInt8, 1 otherwise.
__device__ inline float KvScale(const uint8_t* pool, const PagedKvLayout& l, int32_t block, int h,
                                int is_v, int slot) {
  return l.dtype == KvDType::kInt8
             ? *reinterpret_cast<const float*>(pool + KvScaleOffset(l, block, h, is_v, slot))
             : 1.0f;
}
// Element e of a row of type t, widened (kInt8: not yet scaled).
__device__ inline float KvElem(KvDType t, const uint8_t* row, int e) {
  switch (t) {
    case KvDType::kF32:
      return reinterpret_cast<const float*>(row)[e];
    case KvDType::kBF16:
      return __uint_as_float(static_cast<uint32_t>(reinterpret_cast<const uint16_t*>(row)[e])
                             << 16);
    case KvDType::kF16:
      return __half2float(reinterpret_cast<const __half*>(row)[e]);
    default:
      return static_cast<float>(reinterpret_cast<const int8_t*>(row)[e]);
  }
}
// Writes x as element e of a row of type t; inv_scale = 1 / scale for kInt8.
__device__ inline void KvStoreElem(KvDType t, uint8_t* row, int e, float x, float inv_scale) {
  switch (t) {
    case KvDType::kF32:
      reinterpret_cast<float*>(row)[e] = x;
      return;
    case KvDType::kBF16:
      reinterpret_cast<__nv_bfloat16*>(row)[e] = __float2bfloat16_rn(x);
      return;
    case KvDType::kF16:
      reinterpret_cast<__half*>(row)[e] = __float2half_rn(fminf(fmaxf(x, -65504.0f), 65504.0f));
      return;
    default:
      reinterpret_cast<int8_t*>(row)[e] =
          static_cast<int8_t>(fminf(fmaxf(rintf(x * inv_scale), -127.0f), 127.0f));
  }
}

}  // namespace recall::kernels::cuda
