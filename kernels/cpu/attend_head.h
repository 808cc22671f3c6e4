// AttendHead: attention of one query vector over the first `len` slots of one KV head of
// one layer of a paged cache (PagedKv::Head: the layer's block table looked up once); the
// per-head kernel under Attention::Prefill and ::Decode.
//   p[s] = dot(q, K[s]) * scale for s < len; p = softmax(p); out = sum_s p[s] * V[s].
// AVX-512 builds with head_dim <= 128 score 16 keys at once (one transposing reduction per
// 16 dot products), use the vector exp of simd_math.h and keep q and out in registers.
// Other builds and head sizes use run.c's loops (libm expf, slot-by-slot accumulation).
#pragma once

#include "kernels/tensor.h"

namespace recall::kernels::cpu {

// q, out: [head_dim]; p: [len] scratch that receives the probabilities.
// REQUIRES: len <= slots covered by kv's block table; out does not alias q or p.
void AttendHead(const PagedKvHead& kv, int len, const float* q, float scale, float* p, float* out);

}  // namespace recall::kernels::cpu
