// KV rows in their stored type (kernels/tensor.h KvDType): the rounding the KV store applies
// when it writes a row and the widening attention applies when it reads one. The host
// reference of every backend's store and load; the CPU backend uses it directly.
//
// Store then load is exact for kF32; round to nearest even for kBF16 and kF16 (kF16
// saturates at +-65504 instead of overflowing to infinity); for kInt8 each element is within
// half a step, max|x| / 254, of the input (the scale is max|x| / 127; a zero row stores scale
// 0 and loads as zeros).
#pragma once

#include <cstdint>

#include "kernels/tensor.h"

namespace recall::kernels {

// Encodes x[0, n) into `data` (n elements of `dtype`) and, for kInt8, *scale.
void EncodeKvRow(KvDType dtype, const float* x, int n, void* data, float* scale);
// Decodes n elements of `dtype` (with `scale` for kInt8) into out[0, n).
void DecodeKvRow(KvDType dtype, const void* data, float scale, int n, float* out);

// Row `slot` (K: is_v = 0, V: is_v = 1) of a head in host-addressable memory.
void StoreKvRow(const PagedKvHead& head, int is_v, int slot, const float* x);
void LoadKvRow(const PagedKvHead& head, int is_v, int slot, float* out);

}  // namespace recall::kernels
