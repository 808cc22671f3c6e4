// Paged attention of the CUDA backend: StoreKv and split-KV attention over a whole batch
// (kernels/kv_batch.h), and the row moves of cache compaction.
//
// Attention: the grouped kernel below for head_dim <= 64 (one block per KV split, KV head and
// token, serving the whole GQA group from shared-memory tiles); otherwise one block of 4 warps
// per (KV split, query head, token). Each warp walks every
// 4th slot of its split: a lane holds head_dim / 32 elements of q, the dot product is a warp
// reduction, and an online softmax keeps (max, sum, weighted V) per warp; the warps merge in
// shared memory and write one partial per split. A combine kernel merges the splits (and
// saves each row's max and sum); decode items that asked for probabilities got their raw
// scores written during the walk, and a third kernel turns them into probabilities with the
// saved max and sum. The number of splits grows when the batch has few (token, head) rows, so
// a single long-context sequence still fills the GPU.
#include <algorithm>
#include <cmath>

#include "kernels/cuda/kv_access.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/warp_reduce.cuh"

namespace recall::kernels::cuda {
namespace {

constexpr int kWarps = 4;

struct Row {  // where one token's attention reads from
  int item, j, il, len;
};

__device__ Row FindRow(const KvBatch& b, int layer, int t, int h) {
  Row r;
  r.item = b.token_item[t];
  r.j = t - b.token_begin[r.item];
  r.il = r.item * b.layout.n_layers + layer;
  r.len = b.kv_start[r.il * b.layout.n_kv_heads + h] + r.j + 1;
  return r;
}

// One block per (token, KV head): its K and V rows, converted to the pool's type (int8: the
// row's max |x| found by a block reduction, then the scale written by thread 0).
__global__ void StoreKvKernel(KvBatch b, int layer, const float* k, const float* v) {
  const int t = blockIdx.x, h = blockIdx.y;
  const PagedKvLayout& l = b.layout;
  const int hd = l.head_dim, bt = l.block_tokens, n_kv = l.n_kv_heads;
  const int item = b.token_item[t];
  const int j = t - b.token_begin[item];
  const int il = item * l.n_layers + layer;
  const int slot = b.kv_start[il * n_kv + h] + j;
  const int32_t block = b.tables[b.table_begin[il] + slot / bt];
  uint8_t* pool = static_cast<uint8_t*>(b.pool);
  const int64_t src = (static_cast<int64_t>(t) * n_kv + h) * hd;
  for (int is_v = 0; is_v < 2; ++is_v) {
    const float* x = (is_v ? v : k) + src;
    uint8_t* row = pool + KvRowOffset(l, block, h, is_v, slot);
    float inv = 1.0f;
    if (l.dtype == KvDType::kInt8) {
      __shared__ float s_max[32];
      float m = 0.0f;
      for (int e = threadIdx.x; e < hd; e += blockDim.x) m = fmaxf(m, fabsf(x[e]));
      m = WarpMax(m);
      if ((threadIdx.x & 31) == 0) s_max[threadIdx.x >> 5] = m;
      __syncthreads();
      m = 0.0f;
      for (int w = 0; w < (blockDim.x + 31) / 32; ++w) m = fmaxf(m, s_max[w]);
      __syncthreads();  // s_max is written again for V
      const float scale = m / 127.0f;
      inv = scale > 0.0f ? 1.0f / scale : 0.0f;
      if (threadIdx.x == 0) {
        *reinterpret_cast<float*>(pool + KvScaleOffset(l, block, h, is_v, slot)) = scale;
      }
    }
    for (int e = threadIdx.x; e < hd; e += blockDim.x) KvStoreElem(l.dtype, row, e, x[e], inv);
  }
}


// R: elements of q per lane (head_dim <= 32 * R).
template <int R>
__global__ void __launch_bounds__(kWarps * 32)
    AttentionSplitKernel(KvBatch b, int layer, const float* q, int n_heads, float scale, int chunk,
                         int n_splits, float* partials) {
  const int split = blockIdx.x, qh = blockIdx.y, t = blockIdx.z;
  const int hd = b.layout.head_dim, bt = b.layout.block_tokens, n_kv = b.layout.n_kv_heads;
  const int h = qh / (n_heads / n_kv);
  const Row row = FindRow(b, layer, t, h);
  const int s0 = split * chunk;
  const int s1 = min(row.len, s0 + chunk);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

  float qr[R], acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int e = lane + 32 * r;
    qr[r] = e < hd ? q[(static_cast<int64_t>(t) * n_heads + qh) * hd + e] : 0.0f;
    acc[r] = 0.0f;
  }
  const int32_t* table = b.tables + b.table_begin[row.il];
  const uint8_t* pool = static_cast<const uint8_t*>(b.pool);
  const KvDType dtype = b.layout.dtype;
  float* probs = nullptr;
  if (b.probs != nullptr && b.token_begin[row.item + 1] - b.token_begin[row.item] == 1 &&
      b.probs[row.item] != nullptr) {
    probs = b.probs[row.item] + (static_cast<int64_t>(layer) * n_heads + qh) * b.probs_stride[row.item];
  }

  float m = -INFINITY, l = 0.0f;
  for (int s = s0 + warp; s < s1; s += kWarps) {
    const int32_t block = table[s / bt];
    const uint8_t* K = pool + KvRowOffset(b.layout, block, h, 0, s);
    const uint8_t* V = pool + KvRowOffset(b.layout, block, h, 1, s);
    const float k_scale = KvScale(pool, b.layout, block, h, 0, s);
    const float v_scale = KvScale(pool, b.layout, block, h, 1, s);
    float d = 0.0f;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int e = lane + 32 * r;
      if (e < hd) d += qr[r] * KvElem(dtype, K, e);
    }
    d = WarpSum(d) * k_scale * scale;
    if (probs != nullptr && lane == 0) probs[s] = d;
    const float m_new = fmaxf(m, d);
    const float corr = expf(m - m_new);
    const float p = expf(d - m_new);
    l = l * corr + p;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int e = lane + 32 * r;
      acc[r] = acc[r] * corr + (e < hd ? p * v_scale * KvElem(dtype, V, e) : 0.0f);
    }
    m = m_new;
  }

  // Merge the warps.
  __shared__ float s_m[kWarps], s_l[kWarps];
  __shared__ float s_acc[kWarps][32 * R];
  if (lane == 0) {
    s_m[warp] = m;
    s_l[warp] = l;
  }
#pragma unroll
  for (int r = 0; r < R; ++r) s_acc[warp][lane + 32 * r] = acc[r];
  __syncthreads();
  float M = -INFINITY;
  for (int w = 0; w < kWarps; ++w) M = fmaxf(M, s_m[w]);
  float* out = partials + ((static_cast<int64_t>(t) * n_heads + qh) * n_splits + split) * (hd + 2);
  float w_scale[kWarps];
  float L = 0.0f;
  for (int w = 0; w < kWarps; ++w) {
    w_scale[w] = s_m[w] == -INFINITY ? 0.0f : expf(s_m[w] - M);
    L += s_l[w] * w_scale[w];
  }
  for (int e = threadIdx.x; e < hd; e += blockDim.x) {
    float a = 0.0f;
    for (int w = 0; w < kWarps; ++w) a += s_acc[w][e] * w_scale[w];
    out[2 + e] = a;
  }
  if (threadIdx.x == 0) {
    out[0] = M;
    out[1] = L;
  }
}

// The grouped kernel (head_dim <= 64, up to 16 query heads per KV head): one block of 4 warps
// per (KV split, KV head, token) serves every query head of the KV head's group, so each K/V
// row is read from memory once per token. Tiles of 32 slots go to shared memory (rows padded
// by one float against bank conflicts); a lane scores one slot of the tile for the warp's
// query head, and the warp accumulates V over the tile's probabilities. Warp w owns the
// group's query heads w, w + 4, ...: no merge between warps.
constexpr int kTile = 32;
constexpr int kMaxHeadsPerWarp = 4;

template <int R>
__global__ void __launch_bounds__(kWarps * 32)
    GroupedAttentionKernel(KvBatch b, int layer, const float* q, int n_heads, float scale,
                           int chunk, int n_splits, float* partials) {
  extern __shared__ float smem[];
  const int split = blockIdx.x, h = blockIdx.y, t = blockIdx.z;
  const int hd = b.layout.head_dim, bt = b.layout.block_tokens, n_kv = b.layout.n_kv_heads;
  const int group = n_heads / n_kv;
  const int pad = hd + 1;
  float* s_k = smem;                 // [kTile][pad]
  float* s_v = s_k + kTile * pad;    // [kTile][pad]
  float* s_q = s_v + kTile * pad;    // [group][hd]
  const Row row = FindRow(b, layer, t, h);
  const int s0 = split * chunk;
  const int s1 = min(row.len, s0 + chunk);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

  for (int i = threadIdx.x; i < group * hd; i += blockDim.x) {
    s_q[i] = q[(static_cast<int64_t>(t) * n_heads + h * group) * hd + i];
  }
  const int32_t* table = b.tables + b.table_begin[row.il];
  const uint8_t* pool = static_cast<const uint8_t*>(b.pool);
  const KvDType dtype = b.layout.dtype;
  const bool want_probs = b.probs != nullptr &&
                          b.token_begin[row.item + 1] - b.token_begin[row.item] == 1 &&
                          b.probs[row.item] != nullptr;

  float m[kMaxHeadsPerWarp], l[kMaxHeadsPerWarp], acc[kMaxHeadsPerWarp][R];
#pragma unroll
  for (int k = 0; k < kMaxHeadsPerWarp; ++k) {
    m[k] = -INFINITY;
    l[k] = 0.0f;
#pragma unroll
    for (int r = 0; r < R; ++r) acc[k][r] = 0.0f;
  }

  for (int tile = s0; tile < s1; tile += kTile) {
    const int n_valid = min(kTile, s1 - tile);
    __syncthreads();  // the previous tile (and s_q) are done with / written
    // A warp per slot: the block table, row addresses and scales once per slot, the lanes
    // along the row (the loads of the slots unrolled below are in flight together).
#pragma unroll 4
    for (int j = warp; j < n_valid; j += kWarps) {
      const int s = tile + j;
      const int32_t block = table[s / bt];
      const uint8_t* kr = pool + KvRowOffset(b.layout, block, h, 0, s);
      const uint8_t* vr = pool + KvRowOffset(b.layout, block, h, 1, s);
      const float ks = KvScale(pool, b.layout, block, h, 0, s);
      const float vs = KvScale(pool, b.layout, block, h, 1, s);
      for (int e = lane; e < hd; e += 32) {
        s_k[j * pad + e] = ks * KvElem(dtype, kr, e);
        s_v[j * pad + e] = vs * KvElem(dtype, vr, e);
      }
    }
    __syncthreads();
#pragma unroll
    for (int k = 0; k < kMaxHeadsPerWarp; ++k) {
      const int g = warp + k * kWarps;
      if (g >= group) break;
      const float* qg = s_q + g * hd;
      float d = -INFINITY;
      if (lane < n_valid) {
        d = 0.0f;
        const float* kr = s_k + lane * pad;
        for (int e = 0; e < hd; ++e) d += qg[e] * kr[e];
        d *= scale;
        if (want_probs) {
          b.probs[row.item][(static_cast<int64_t>(layer) * n_heads + h * group + g) *
                                b.probs_stride[row.item] +
                            tile + lane] = d;
        }
      }
      const float tile_max = WarpMax(d);
      const float m_new = fmaxf(m[k], tile_max);
      const float corr = expf(m[k] - m_new);
      const float p = lane < n_valid ? expf(d - m_new) : 0.0f;
      l[k] = l[k] * corr + WarpSum(p);
#pragma unroll
      for (int r = 0; r < R; ++r) acc[k][r] *= corr;
      for (int j = 0; j < n_valid; ++j) {
        const float pj = __shfl_sync(0xffffffffu, p, j);
        const float* vr = s_v + j * pad;
#pragma unroll
        for (int r = 0; r < R; ++r) {
          const int e = lane + 32 * r;
          if (e < hd) acc[k][r] += pj * vr[e];
        }
      }
      m[k] = m_new;
    }
  }

#pragma unroll
  for (int k = 0; k < kMaxHeadsPerWarp; ++k) {
    const int g = warp + k * kWarps;
    if (g >= group) break;
    const int qh = h * group + g;
    float* out =
        partials + ((static_cast<int64_t>(t) * n_heads + qh) * n_splits + split) * (hd + 2);
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int e = lane + 32 * r;
      if (e < hd) out[2 + e] = acc[k][r];
    }
    if (lane == 0) {
      out[0] = m[k];
      out[1] = l[k];
    }
  }
}

__global__ void CombineKernel(const float* partials, int n_heads, int hd, int n_splits, float* out,
                              float* stats) {
  const int qh = blockIdx.x, t = blockIdx.y;
  const int64_t rowi = static_cast<int64_t>(t) * n_heads + qh;
  const float* p = partials + rowi * n_splits * (hd + 2);
  float M = -INFINITY;
  for (int s = 0; s < n_splits; ++s) M = fmaxf(M, p[s * (hd + 2)]);
  float L = 0.0f;
  for (int s = 0; s < n_splits; ++s) {
    const float ms = p[s * (hd + 2)];
    if (ms != -INFINITY) L += p[s * (hd + 2) + 1] * expf(ms - M);
  }
  for (int e = threadIdx.x; e < hd; e += blockDim.x) {
    float a = 0.0f;
    for (int s = 0; s < n_splits; ++s) {
      const float ms = p[s * (hd + 2)];
      if (ms != -INFINITY) a += p[s * (hd + 2) + 2 + e] * expf(ms - M);
    }
    out[rowi * hd + e] = a / L;
  }
  if (threadIdx.x == 0) {
    stats[rowi * 2] = M;
    stats[rowi * 2 + 1] = L;
  }
}

__global__ void ProbsKernel(KvBatch b, int layer, int n_heads, const float* stats) {
  const int qh = blockIdx.x, t = blockIdx.y;
  const int h = qh / (n_heads / b.layout.n_kv_heads);
  const Row row = FindRow(b, layer, t, h);
  if (b.token_begin[row.item + 1] - b.token_begin[row.item] != 1 || b.probs[row.item] == nullptr) {
    return;
  }
  float* probs =
      b.probs[row.item] + (static_cast<int64_t>(layer) * n_heads + qh) * b.probs_stride[row.item];
  const int64_t rowi = static_cast<int64_t>(t) * n_heads + qh;
  const float M = stats[rowi * 2], L = stats[rowi * 2 + 1];
  for (int s = threadIdx.x; s < row.len; s += blockDim.x) probs[s] = expf(probs[s] - M) / L;
}

// A move's words: its K row, its V row, then (int8) the K and V scales.
__global__ void GatherRowsKernel(const uint8_t* base, const RowMove* moves, int row_words,
                                 int64_t v_offset, int64_t v_scale_offset, bool scaled,
                                 uint32_t* scratch) {
  const RowMove mv = moves[blockIdx.x];
  uint32_t* dst = scratch + static_cast<int64_t>(blockIdx.x) * (2 * row_words + 2);
  const uint32_t* k = reinterpret_cast<const uint32_t*>(base + mv.src_row);
  const uint32_t* v = reinterpret_cast<const uint32_t*>(base + mv.src_row + v_offset);
  for (int e = threadIdx.x; e < row_words; e += blockDim.x) {
    dst[e] = k[e];
    dst[row_words + e] = v[e];
  }
  if (scaled && threadIdx.x == 0) {
    dst[2 * row_words] = *reinterpret_cast<const uint32_t*>(base + mv.src_scale);
    dst[2 * row_words + 1] =
        *reinterpret_cast<const uint32_t*>(base + mv.src_scale + v_scale_offset);
  }
}

__global__ void ScatterRowsKernel(uint8_t* base, const RowMove* moves, int row_words,
                                  int64_t v_offset, int64_t v_scale_offset, bool scaled,
                                  const uint32_t* scratch) {
  const RowMove mv = moves[blockIdx.x];
  const uint32_t* src = scratch + static_cast<int64_t>(blockIdx.x) * (2 * row_words + 2);
  uint32_t* k = reinterpret_cast<uint32_t*>(base + mv.dst_row);
  uint32_t* v = reinterpret_cast<uint32_t*>(base + mv.dst_row + v_offset);
  for (int e = threadIdx.x; e < row_words; e += blockDim.x) {
    k[e] = src[e];
    v[e] = src[row_words + e];
  }
  if (scaled && threadIdx.x == 0) {
    *reinterpret_cast<uint32_t*>(base + mv.dst_scale) = src[2 * row_words];
    *reinterpret_cast<uint32_t*>(base + mv.dst_scale + v_scale_offset) = src[2 * row_words + 1];
  }
}

int Threads(int hd) { return std::min(256, std::max(32, (hd + 31) / 32 * 32)); }

// Splits per row: enough for about 4 blocks per SM, at most 64, and none shorter than 32
// slots.
// Blocks a launch aims for per SM. The walk is latency-bound (block table, then K, then V, per
// slot), so more, shorter splits finish sooner: 4 per SM left a batch-1 Llama-3-8B layer at
// 39 us over 307 slots on an H100 (2.5 MB read), and 71 us when lazy's longest head held more.
constexpr int kBlocksPerSm = 8;
constexpr int kMinChunk = 16;

int Splits(int rows, int max_kv_len, int sm_count) {
  const int want = (kBlocksPerSm * sm_count + rows - 1) / std::max(1, rows);
  return std::max(1, std::min({want, 64, (max_kv_len + kMinChunk - 1) / kMinChunk}));
}

}  // namespace

void LaunchStoreKv(const KvBatch& b, int layer, const float* k, const float* v,
                   cudaStream_t stream) {
  if (b.total_tokens <= 0) return;
  StoreKvKernel<<<dim3(b.total_tokens, b.layout.n_kv_heads), Threads(b.layout.head_dim), 0,
                  stream>>>(b, layer, k, v);
}

int64_t AttentionPartialFloats(int max_tokens, int max_heads, int head_dim, int sm_count) {
  // Rows are (token, query head); a launch splits each (token, KV head) into at most
  // ceil(kBlocksPerSm * sm_count / (tokens * kv_heads)) pieces, so
  // tokens * splits <= tokens + kBlocksPerSm * sm_count.
  return (static_cast<int64_t>(max_tokens) + kBlocksPerSm * sm_count + 64) * max_heads *
         (head_dim + 2);
}

void LaunchAttention(const KvBatch& b, int layer, const float* q, int n_heads, float scale,
                     float* out, const AttentionScratch& scratch, cudaStream_t stream) {
  if (b.total_tokens <= 0) return;
  const int hd = b.layout.head_dim;
  const int rows = b.total_tokens * n_heads;
  const int group = n_heads / b.layout.n_kv_heads;
  const int threads = kWarps * 32;
  int n_splits;
  // The grouped kernel won at head_dim 64 on an H200 (SmolLM2 shape, batch 64, 8K: 60 -> 35 ms
  // per step) and lost at 128 (Llama-3-8B shape, batch 16, 8K: 40 -> 46 ms): bench/results.
  if (hd <= 64 && group <= kWarps * kMaxHeadsPerWarp) {
    n_splits = Splits(b.total_tokens * b.layout.n_kv_heads, b.max_kv_len, scratch.sm_count);
    const int chunk = ((b.max_kv_len + n_splits - 1) / n_splits + kTile - 1) / kTile * kTile;
    n_splits = (b.max_kv_len + chunk - 1) / chunk;
    const dim3 grid(n_splits, b.layout.n_kv_heads, b.total_tokens);
    const size_t smem = (2 * kTile * (hd + 1) + group * hd) * sizeof(float);
    if (hd <= 32) {
      GroupedAttentionKernel<1><<<grid, threads, smem, stream>>>(b, layer, q, n_heads, scale,
                                                                 chunk, n_splits, scratch.partials);
    } else {
      GroupedAttentionKernel<2><<<grid, threads, smem, stream>>>(b, layer, q, n_heads, scale,
                                                                 chunk, n_splits, scratch.partials);
    }
  } else {
    n_splits = Splits(rows, b.max_kv_len, scratch.sm_count);
    const int chunk = (b.max_kv_len + n_splits - 1) / n_splits;
    const dim3 grid(n_splits, n_heads, b.total_tokens);
    if (hd <= 32) {
      AttentionSplitKernel<1><<<grid, threads, 0, stream>>>(b, layer, q, n_heads, scale, chunk,
                                                           n_splits, scratch.partials);
    } else if (hd <= 64) {
      AttentionSplitKernel<2><<<grid, threads, 0, stream>>>(b, layer, q, n_heads, scale, chunk,
                                                           n_splits, scratch.partials);
    } else if (hd <= 128) {
      AttentionSplitKernel<4><<<grid, threads, 0, stream>>>(b, layer, q, n_heads, scale, chunk,
                                                           n_splits, scratch.partials);
    } else {
      AttentionSplitKernel<8><<<grid, threads, 0, stream>>>(b, layer, q, n_heads, scale, chunk,
                                                           n_splits, scratch.partials);
    }
  }
  CombineKernel<<<dim3(n_heads, b.total_tokens), Threads(hd), 0, stream>>>(
      scratch.partials, n_heads, hd, n_splits, out, scratch.stats);
  if (b.probs != nullptr) {
    ProbsKernel<<<dim3(n_heads, b.total_tokens), 256, 0, stream>>>(b, layer, n_heads,
                                                                   scratch.stats);
  }
}

void LaunchMoveRows(uint8_t* base, const RowMove* moves, int m, const PagedKvLayout& layout,
                    uint32_t* scratch, cudaStream_t stream) {
  if (m <= 0) return;
  const int row_words = static_cast<int>(layout.RowBytes() / 4);
  const int64_t v_offset = layout.PlaneBytes();  // V's plane follows K's
  const bool scaled = layout.dtype == KvDType::kInt8;
  GatherRowsKernel<<<m, Threads(row_words), 0, stream>>>(base, moves, row_words, v_offset, v_offset,
                                                         scaled, scratch);
  ScatterRowsKernel<<<m, Threads(row_words), 0, stream>>>(base, moves, row_words, v_offset,
                                                          v_offset, scaled, scratch);
}

}  // namespace recall::kernels::cuda
