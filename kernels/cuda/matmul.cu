// The CUDA backend's batch-invariant matmul for few rows: y = x * w^T with x fp32 [n, K], w
// f32 / bf16 / f16 / int8 / fp8 [O, K], y fp32 [n, O], on CUDA cores with fp32 accumulation.
// Int8 weights are widened to fp32 in registers and the sum is multiplied by the row's scale
// at the end (weight-only: x is not quantized, unlike the CPU's int8 kernels). FP8 (E4M3)
// weights are widened and multiplied by their block's scale in registers, before the FMAs:
// each element is then e4m3 * scale rounded once, the value the host's reference widens to
// (a block is a multiple of 8 columns, so the 8 elements of a chunk share one scale).
//
// Batch invariance by construction: y[r, o] is the same sequence of operations whatever n
// is and wherever row r sits in the batch. Lane l of the warp that owns output o takes the
// chunks c = l, l + 32, ... of 8 consecutive elements of row o of w and row r of x,
// accumulates them with fmaf in element order, and the 32 partial sums meet in a fixed
// butterfly. Only the loads depend on alignment (16-byte vectors when x, w and K allow, one
// element at a time otherwise), never the arithmetic. Each warp holds kO outputs for up to kR
// rows, so a weight row is read once per kR rows of x: a decode batch reads the weights
// once, not once per sequence. The weights are widened to fp32 exactly; x is not rounded.
// One launch may take up to three matrices of the same input (q/k/v, gate/up): each output is
// computed exactly as a launch of its matrix alone would. A warp holds 2 outputs for up to 4
// rows (many warps: weight-bandwidth bound) and 4 outputs above that, so x, which every warp
// reads, is read half as often (measured on an H100: at 16 rows x's re-reads through L2, not
// the weights, set the time). How many outputs a warp holds never changes an output's
// arithmetic.
//
// Chunks in flight (up to 4 rows): each lane may load the weights of kU of its chunks (c,
// c + 32, ..., c + 32 (kU - 1)) before the FMAs of the first, so a warp has kU times the
// weight bytes in flight; the FMAs still take the chunks in increasing order, so every kU
// gives the same bits. A 1-byte weight loads 8 bytes per lane per chunk, half of bf16's, and
// the kernel at batch 1 is latency bound: on an H200 int8 decode (kU 1) read its weights at
// 22% of the copy roofline and ran 0.82x bf16's speed (bench/gpu/NOTES.md). Which kU pays is
// measured by recall_gpu_matmul_bench; CudaBackendOptions::skinny_chunks_in_flight picks it.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/launch.h"

namespace recall::kernels::cuda {
namespace {

constexpr int kR = 16;  // rows of x per warp
constexpr int kWarps = 4;

// The 8 elements of chunk c (elements 8c .. 8c + 7, those below `count`) as floats; 0 past
// the end.
template <bool kVector>
__device__ inline void Load8(const float* p, int64_t c, int64_t count, float* out) {
  const int64_t k = 8 * c;
  if (kVector) {
    const float4 a = reinterpret_cast<const float4*>(p + k)[0];
    const float4 b = reinterpret_cast<const float4*>(p + k)[1];
    out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
    out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
  } else {
    for (int e = 0; e < 8; ++e) out[e] = k + e < count ? p[k + e] : 0.0f;
  }
}

template <bool kVector>
__device__ inline void Load8(const __nv_bfloat16* p, int64_t c, int64_t count, float* out) {
  const int64_t k = 8 * c;
  if (kVector) {
    const uint4 v = *reinterpret_cast<const uint4*>(p + k);
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
    for (int i = 0; i < 4; ++i) {
      out[2 * i] = __uint_as_float(words[i] << 16);
      out[2 * i + 1] = __uint_as_float(words[i] & 0xFFFF0000u);
    }
  } else {
    for (int e = 0; e < 8; ++e) out[e] = k + e < count ? __bfloat162float(p[k + e]) : 0.0f;
  }
}

template <bool kVector>
__device__ inline void Load8(const __half* p, int64_t c, int64_t count, float* out) {
  const int64_t k = 8 * c;
  if (kVector) {
    const uint4 v = *reinterpret_cast<const uint4*>(p + k);
    const __half2* h = reinterpret_cast<const __half2*>(&v);
    for (int i = 0; i < 4; ++i) {
      const float2 f = __half22float2(h[i]);
      out[2 * i] = f.x;
      out[2 * i + 1] = f.y;
    }
  } else {
    for (int e = 0; e < 8; ++e) out[e] = k + e < count ? __half2float(p[k + e]) : 0.0f;
  }
}

template <bool kVector>
__device__ inline void Load8(const int8_t* p, int64_t c, int64_t count, float* out) {
  const int64_t k = 8 * c;
  if (kVector) {
    const uint2 v = *reinterpret_cast<const uint2*>(p + k);
    const int8_t* b = reinterpret_cast<const int8_t*>(&v);
    for (int e = 0; e < 8; ++e) out[e] = static_cast<float>(b[e]);
  } else {
    for (int e = 0; e < 8; ++e) out[e] = k + e < count ? static_cast<float>(p[k + e]) : 0.0f;
  }
}

template <bool kVector>
__device__ inline void Load8(const __nv_fp8_e4m3* p, int64_t c, int64_t count, float* out) {
  const int64_t k = 8 * c;
  if (kVector) {
    const uint2 v = *reinterpret_cast<const uint2*>(p + k);
    const __nv_fp8x2_e4m3* pairs = reinterpret_cast<const __nv_fp8x2_e4m3*>(&v);
    for (int i = 0; i < 4; ++i) {
      const float2 f = static_cast<float2>(pairs[i]);
      out[2 * i] = f.x;
      out[2 * i + 1] = f.y;
    }
  } else {
    for (int e = 0; e < 8; ++e) out[e] = k + e < count ? static_cast<float>(p[k + e]) : 0.0f;
  }
}

// The 8 widened weights of chunk c of row o, times their block's scale when W is FP8.
template <typename W, bool kVector>
__device__ inline void LoadWeights8(const W* w, int o, int64_t K, int64_t c, const float* scales,
                                    int scale_cols, int scale_block, float* out) {
  Load8<kVector>(w + static_cast<int64_t>(o) * K, c, K, out);
  if constexpr (std::is_same_v<W, __nv_fp8_e4m3>) {
    const float s = scales[static_cast<int64_t>(o) * scale_cols + (8 * c) / scale_block];
    for (int e = 0; e < 8; ++e) out[e] *= s;
  }
}

// Up to kMaxProjections matrices of the same input: warp group g belongs to the first
// matrix m with g < group_end[m].
template <typename W>
struct Projections {
  const W* w[kMaxProjections];
  const float* scales[kMaxProjections];  // int8: one per output row; fp8: [rows, scale_cols]
  int scale_cols[kMaxProjections];       // fp8: scales per row
  int scale_block[kMaxProjections];      // fp8: columns per scale
  float* y[kMaxProjections];
  int rows[kMaxProjections];
  int group_end[kMaxProjections];
  int count;
};

static_assert(kMaxProjections == 3, "Pick3 picks among three");

// Field m of a Projections array without a dynamic index into the kernel's parameters.
template <typename T>
__device__ inline T Pick3(const T (&a)[kMaxProjections], int m) {
  return m == 0 ? a[0] : (m == 1 ? a[1] : a[2]);
}

// The 32 lanes' partial sums of each output meet in a fixed butterfly; lane 0 stores them
// (times the row's scale for int8 weights).
template <typename W, int kO>
__device__ inline void StoreSums(float (&acc)[kO][kR], int rows, int lane, int o0, int O, int r0,
                                 const float* scales, float* y) {
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    if (r >= rows) break;
    for (int i = 0; i < kO; ++i) {
      float v = acc[i][r];
      for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
      if (lane == 0 && o0 + i < O) {
        if constexpr (std::is_same_v<W, int8_t>) v *= scales[o0 + i];
        y[static_cast<int64_t>(r0 + r) * O + o0 + i] = v;
      }
    }
  }
}

// blockIdx.x * kWarps + warp: the output group (kO outputs of one matrix); blockIdx.y: the
// group of kR rows. kU: chunks each lane loads before their FMAs (above).
template <typename W, bool kVector, int kO, int kU>
__global__ void SkinnyMatMulKernel(const float* x, int n, int64_t K, const Projections<W> p) {
  const int lane = threadIdx.x & 31;
  const int g = blockIdx.x * kWarps + (threadIdx.x >> 5);
  if (g >= Pick3(p.group_end, p.count - 1)) return;  // the whole warp
  int m = 0;
  while (g >= Pick3(p.group_end, m)) ++m;
  const W* w = Pick3(p.w, m);
  const float* scales = Pick3(p.scales, m);
  const int scale_cols = Pick3(p.scale_cols, m), scale_block = Pick3(p.scale_block, m);
  float* y = Pick3(p.y, m);
  const int O = Pick3(p.rows, m);
  const int o0 = (g - (m == 0 ? 0 : Pick3(p.group_end, m - 1))) * kO;
  const int r0 = blockIdx.y * kR;
  const int rows = min(kR, n - r0);
  float acc[kO][kR];
  for (int i = 0; i < kO; ++i) {
    for (int r = 0; r < kR; ++r) acc[i][r] = 0.0f;
  }
  const int64_t chunks = (K + 7) / 8;
  for (int64_t c0 = lane; c0 < chunks; c0 += 32 * kU) {
    float wv[kU][kO][8];  // every load first, then the FMAs in chunk order
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int64_t c = c0 + 32 * u;
      for (int i = 0; i < kO; ++i) {
        if (c < chunks && o0 + i < O) {
          LoadWeights8<W, kVector>(w, o0 + i, K, c, scales, scale_cols, scale_block, wv[u][i]);
        } else {
          for (int e = 0; e < 8; ++e) wv[u][i][e] = 0.0f;
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kU; ++u) {
      const int64_t c = c0 + 32 * u;
      if (c >= chunks) break;
#pragma unroll
      for (int r = 0; r < kR; ++r) {
        if (r >= rows) break;
        float xv[8];
        Load8<kVector>(x + static_cast<int64_t>(r0 + r) * K, c, K, xv);
        for (int i = 0; i < kO; ++i) {
          for (int e = 0; e < 8; ++e) acc[i][r] = fmaf(xv[e], wv[u][i][e], acc[i][r]);
        }
      }
    }
  }
  StoreSums<W, kO>(acc, rows, lane, o0, O, r0, scales, y);
}

// Above 4 rows the kernel above stalls on x: its warps are at different points of K, so the
// 16 rows they read do not stay in L1 and every x load waits on L2 (measured on an H100: 16
// rows took 6x the time of one, with the FMA units mostly idle). StagedMatMulKernel computes
// the same outputs with the same arithmetic (lane l, chunks l, l + 32, ..., fmaf in element
// order, the same butterfly), but its warps walk K together, tile by tile (32 chunks: one per
// lane), and each tile of x is staged once per block in shared memory. A chunk's 8 elements
// sit as two halves 128 floats apart, so a warp's 16-byte reads meet no bank conflict.
constexpr int kTileChunks = 32;
constexpr int kTile = 8 * kTileChunks;
constexpr int kHalf = kTile / 2;

template <typename W, bool kVector, int kO>
__global__ void __launch_bounds__(kWarps * 32)
    StagedMatMulKernel(const float* x, int n, int64_t K, const Projections<W> p) {
  __shared__ __align__(16) float xs[kR][kTile];
  const int lane = threadIdx.x & 31;
  const int g = blockIdx.x * kWarps + (threadIdx.x >> 5);
  const bool active = g < Pick3(p.group_end, p.count - 1);  // else it only stages x
  int m = 0;
  while (active && g >= Pick3(p.group_end, m)) ++m;
  const W* w = Pick3(p.w, m);
  const float* scales = Pick3(p.scales, m);
  const int scale_cols = Pick3(p.scale_cols, m), scale_block = Pick3(p.scale_block, m);
  float* y = Pick3(p.y, m);
  const int O = Pick3(p.rows, m);
  const int o0 = (g - (m == 0 ? 0 : Pick3(p.group_end, m - 1))) * kO;
  const int r0 = blockIdx.y * kR;
  const int rows = min(kR, n - r0);
  float acc[kO][kR];
  for (int i = 0; i < kO; ++i) {
    for (int r = 0; r < kR; ++r) acc[i][r] = 0.0f;
  }
  const int64_t chunks = (K + 7) / 8;
  for (int64_t t0 = 0; t0 < chunks; t0 += kTileChunks) {
    __syncthreads();  // the last tile is read
    for (int i = threadIdx.x; i < kR * (kTile / 4); i += blockDim.x) {
      const int r = i / (kTile / 4);
      const int e = (i % (kTile / 4)) * 4;  // element of the tile, a multiple of 4
      if (r >= rows) break;
      const int64_t k = 8 * t0 + e;
      const float* row = x + static_cast<int64_t>(r0 + r) * K;
      float4 v;
      if (kVector) {
        v = k < K ? *reinterpret_cast<const float4*>(row + k) : make_float4(0, 0, 0, 0);
      } else {
        v.x = k < K ? row[k] : 0.0f;
        v.y = k + 1 < K ? row[k + 1] : 0.0f;
        v.z = k + 2 < K ? row[k + 2] : 0.0f;
        v.w = k + 3 < K ? row[k + 3] : 0.0f;
      }
      // Chunk e / 8's first half at 4 (e / 8), its second half kHalf further.
      *reinterpret_cast<float4*>(&xs[r][(e % 8 == 0 ? 0 : kHalf) + 4 * (e / 8)]) = v;
    }
    __syncthreads();
    const int64_t c = t0 + lane;
    if (!active || c >= chunks) continue;
    float wv[kO][8];
    for (int i = 0; i < kO; ++i) {
      if (o0 + i < O) {
        LoadWeights8<W, kVector>(w, o0 + i, K, c, scales, scale_cols, scale_block, wv[i]);
      } else {
        for (int e = 0; e < 8; ++e) wv[i][e] = 0.0f;
      }
    }
#pragma unroll
    for (int r = 0; r < kR; ++r) {
      if (r >= rows) break;
      const float4 a = *reinterpret_cast<const float4*>(&xs[r][4 * lane]);
      const float4 b = *reinterpret_cast<const float4*>(&xs[r][kHalf + 4 * lane]);
      const float xv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
      for (int i = 0; i < kO; ++i) {
        for (int e = 0; e < 8; ++e) acc[i][r] = fmaf(xv[e], wv[i][e], acc[i][r]);
      }
    }
  }
  if (!active) return;
  StoreSums<W, kO>(acc, rows, lane, o0, O, r0, scales, y);
}

// Up to 4 rows: SkinnyMatMulKernel with 2 outputs per warp and kU chunks in flight; above
// that StagedMatMulKernel with 4.
template <typename W, int kO, int kU>
void Launch(const float* x, int n, const Matrix* w, float* const* y, int count,
            cudaStream_t stream) {
  static_assert(kO == 2 || kU == 1, "chunks in flight are the skinny kernel's");
  const int64_t K = w[0].cols;
  Projections<W> p{};
  p.count = count;
  bool vector = K % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  int groups = 0;
  for (int m = 0; m < count; ++m) {
    p.w[m] = static_cast<const W*>(w[m].data);
    p.scales[m] = w[m].scales;
    p.scale_cols[m] = static_cast<int>(w[m].ScaleColumns());
    p.scale_block[m] = w[m].scale_block;
    p.y[m] = y[m];
    p.rows[m] = static_cast<int>(w[m].rows);
    groups += (p.rows[m] + kO - 1) / kO;
    p.group_end[m] = groups;
    vector = vector && reinterpret_cast<uintptr_t>(w[m].data) % 16 == 0;
  }
  for (int m = count; m < kMaxProjections; ++m) p.group_end[m] = groups;
  if (groups == 0) return;
  const dim3 grid((groups + kWarps - 1) / kWarps, (n + kR - 1) / kR);
  if constexpr (kO == 4) {
    (vector ? StagedMatMulKernel<W, true, kO>
            : StagedMatMulKernel<W, false, kO>)<<<grid, kWarps * 32, 0, stream>>>(x, n, K, p);
  } else {
    (vector ? SkinnyMatMulKernel<W, true, kO, kU>
            : SkinnyMatMulKernel<W, false, kO, kU>)<<<grid, kWarps * 32, 0, stream>>>(x, n, K, p);
  }
}

template <typename W>
void Launch(const float* x, int n, const Matrix* w, float* const* y, int count,
            int chunks_in_flight, cudaStream_t stream) {
  if (n > 4) return Launch<W, 4, 1>(x, n, w, y, count, stream);
  switch (chunks_in_flight) {
    case 2:
      return Launch<W, 2, 2>(x, n, w, y, count, stream);
    case 4:
      return Launch<W, 2, 4>(x, n, w, y, count, stream);
    default:
      return Launch<W, 2, 1>(x, n, w, y, count, stream);
  }
}

}  // namespace

bool ValidChunksInFlight(int chunks_in_flight) {
  return chunks_in_flight == 0 || chunks_in_flight == 1 || chunks_in_flight == 2 ||
         chunks_in_flight == 4;
}

int DefaultChunksInFlight(DType /*weights*/) { return 1; }

void LaunchSkinnyMatMul(const float* x, int n, const Matrix* w, float* const* y, int count,
                        int chunks_in_flight, cudaStream_t stream) {
  if (n <= 0 || count <= 0) return;
  const int u = chunks_in_flight > 0 ? chunks_in_flight : DefaultChunksInFlight(w[0].dtype);
  switch (w[0].dtype) {
    case DType::kF32:
      return Launch<float>(x, n, w, y, count, u, stream);
    case DType::kBF16:
      return Launch<__nv_bfloat16>(x, n, w, y, count, u, stream);
    case DType::kF16:
      return Launch<__half>(x, n, w, y, count, u, stream);
    case DType::kI8:
      return Launch<int8_t>(x, n, w, y, count, u, stream);
    case DType::kF8E4M3:
      return Launch<__nv_fp8_e4m3>(x, n, w, y, count, u, stream);
  }
}

}  // namespace recall::kernels::cuda
