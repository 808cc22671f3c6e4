// The inputs cuBLASLt's block-scaled FP8 GEMM reads (kernels/cuda/fp8_gemm.h): activations
// quantized to E4M3 per row and block of 128 columns with their fp32 scales, the weights'
// block scales transposed to the layout cuBLASLt reads, and a bf16 product widened to fp32.
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/cuda/launch.h"

namespace recall::kernels::cuda {
namespace {

constexpr int kBlock = 128;  // columns per scale; 32 lanes x 4
constexpr int kThreads = 256;

// One warp per (row, block): the block's largest |x| sets scale = amax / 448 (1 for an
// all-zero block), each element becomes E4M3(x / scale), saturated to +-448. The scale of
// (row, block) lands at block * n + row (cuBLASLt's VEC128 layout: the outer dimension
// contiguous).
__global__ void QuantizeKernel(const float* x, int n, int64_t cols, uint8_t* q, float* scales) {
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  const int64_t blocks = cols / kBlock;
  if (warp >= static_cast<int64_t>(n) * blocks) return;
  const int64_t row = warp / blocks, block = warp % blocks;
  const int64_t at = row * cols + block * kBlock + lane * 4;
  const float4 v = *reinterpret_cast<const float4*>(x + at);
  float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
  for (int offset = 16; offset > 0; offset >>= 1) {
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, offset));
  }
  const float scale = amax > 0.0f ? amax / 448.0f : 1.0f;
  const __nv_fp8x2_storage_t lo =
      __nv_cvt_float2_to_fp8x2(make_float2(v.x / scale, v.y / scale), __NV_SATFINITE, __NV_E4M3);
  const __nv_fp8x2_storage_t hi =
      __nv_cvt_float2_to_fp8x2(make_float2(v.z / scale, v.w / scale), __NV_SATFINITE, __NV_E4M3);
  *reinterpret_cast<uint32_t*>(q + at) =
      static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
  if (lane == 0) scales[block * n + row] = scale;
}

// out[b * rows + r] = in[r * blocks + b].
__global__ void TransposeScalesKernel(const float* in, int64_t rows, int64_t blocks, float* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * blocks) return;
  const int64_t r = i % rows, b = i / rows;
  out[i] = in[r * blocks + b];
}

__global__ void WidenKernel(const __nv_bfloat16* in, int64_t count, float* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < count) out[i] = __bfloat162float(in[i]);
}

unsigned Grid(int64_t threads) {
  return static_cast<unsigned>((threads + kThreads - 1) / kThreads);
}

}  // namespace

void LaunchQuantizeE4M3Rows(const float* x, int n, int64_t cols, uint8_t* q, float* scales,
                            cudaStream_t stream) {
  const int64_t warps = static_cast<int64_t>(n) * (cols / kBlock);
  if (warps == 0) return;
  QuantizeKernel<<<Grid(warps * 32), kThreads, 0, stream>>>(x, n, cols, q, scales);
}

void LaunchTransposeScales(const float* in, int64_t rows, int64_t blocks, float* out,
                           cudaStream_t stream) {
  if (rows * blocks == 0) return;
  TransposeScalesKernel<<<Grid(rows * blocks), kThreads, 0, stream>>>(in, rows, blocks, out);
}

void LaunchWidenBf16(const void* in, int64_t count, float* out, cudaStream_t stream) {
  if (count == 0) return;
  WidenKernel<<<Grid(count), kThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(in), count,
                                                    out);
}

}  // namespace recall::kernels::cuda
