// Sampling kernels of the CUDA backend: the greedy choice (Backend::ArgmaxRows), so a greedy
// decode step copies one token id per sequence to the host instead of its logits.
#include <cstdint>

#include "kernels/cuda/launch.h"

namespace recall::kernels::cuda {
namespace {

constexpr int kThreads = 512;

// (v, i) beats (bv, bi) when larger, or equal at a lower index: the host loop's choice.
__device__ inline bool Beats(float v, int i, float bv, int bi) {
  return v > bv || (v == bv && i < bi);
}

__global__ void ArgmaxRowsKernel(const float* x, int cols, int32_t* out) {
  const float* row = x + static_cast<int64_t>(blockIdx.x) * cols;
  float best = row[0];
  int best_i = 0;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) {
    const float v = row[j];
    if (Beats(v, j, best, best_i)) best = v, best_i = j;
  }
  for (int off = 16; off > 0; off >>= 1) {
    const float v = __shfl_down_sync(0xffffffffu, best, off);
    const int i = __shfl_down_sync(0xffffffffu, best_i, off);
    if (Beats(v, i, best, best_i)) best = v, best_i = i;
  }
  __shared__ float vals[kThreads / 32];
  __shared__ int idx[kThreads / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) vals[warp] = best, idx[warp] = best_i;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < blockDim.x / 32; ++w) {
      if (Beats(vals[w], idx[w], best, best_i)) best = vals[w], best_i = idx[w];
    }
    out[blockIdx.x] = best_i;
  }
}

}  // namespace

void LaunchArgmaxRows(const float* x, int rows, int cols, int32_t* out, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  ArgmaxRowsKernel<<<rows, kThreads, 0, stream>>>(x, cols, out);
}

}  // namespace recall::kernels::cuda
