// Eviction kernels of the CUDA backend: LazyEviction's fused per-step update
// (Backend::LazyObserve). Integer state and a max over floats: the results equal the CPU
// reference (kernels/cpu/default_ops.cc) bit for bit.
#include <algorithm>

#include "kernels/cuda/launch.h"

namespace recall::kernels::cuda {
namespace {

// blockIdx.y: the (layer, KV head) row; the x blocks stride over its slots.
__global__ void LazyObserveKernel(const float* probs, int64_t probs_stride, int n_heads,
                                  int n_kv_heads, int32_t* ts, int32_t* mri,
                                  int64_t state_stride, const int32_t* old_lens,
                                  const int32_t* lens, float alpha, int t) {
  const int r = blockIdx.y;
  const int layer = r / n_kv_heads, h = r % n_kv_heads;
  const int group = n_heads / n_kv_heads;
  const int len = lens[r], old = old_lens[r];
  int32_t* ts_row = ts + r * state_stride;
  int32_t* mri_row = mri + r * state_stride;
  const float* first =
      probs + (static_cast<int64_t>(layer) * n_heads + static_cast<int64_t>(h) * group) *
                  probs_stride;
  for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < len; j += gridDim.x * blockDim.x) {
    int32_t s = j >= old ? t - 1 : ts_row[j];
    int32_t m = j >= old ? 0 : mri_row[j];
    float p = first[j];
    for (int g = 1; g < group; ++g) {
      const float q = first[g * probs_stride + j];
      p = p < q ? q : p;  // std::max's NaN behaviour, as the reference
    }
    if (p >= alpha) {
      m = max(m, t - s);
      s = t;
    }
    ts_row[j] = s;
    mri_row[j] = m;
  }
}

}  // namespace

void LaunchLazyObserve(const LazyObserveArgs& a, const int32_t* old_lens, const int32_t* lens,
                       int max_len, cudaStream_t stream) {
  const int rows = a.n_layers * a.n_kv_heads;
  if (rows <= 0 || max_len <= 0) return;
  constexpr int kThreads = 256;
  const dim3 grid(std::min((max_len + kThreads - 1) / kThreads, 64), rows);
  LazyObserveKernel<<<grid, kThreads, 0, stream>>>(a.probs, a.probs_stride, a.n_heads,
                                                   a.n_kv_heads, a.ts, a.mri, a.state_stride,
                                                   old_lens, lens, a.alpha, a.t);
}

}  // namespace recall::kernels::cuda
