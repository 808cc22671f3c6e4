// Elementwise and row-wise kernels of the CUDA backend: embedding, RMSNorm, RoPE, bias, add,
// SiLU-mul, softmax, rounding to bf16/f16. The float formulas follow the CPU reference
// (kernels/cpu/elementwise.cc); reductions run in a different order, so results agree to
// rounding, not bit for bit.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>

#include "kernels/cuda/kv_access.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/warp_reduce.cuh"

namespace recall::kernels::cuda {
namespace {

constexpr int kThreads = 256;

int Blocks(int64_t count, int threads = kThreads) {
  return static_cast<int>(std::min<int64_t>((count + threads - 1) / threads, 65535 * 8));
}

// Sum (or max) over the block; every thread gets the result. `shared` holds 32 floats.
__device__ float BlockSum(float v, float* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = WarpSum(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  v = lane < warps ? shared[lane] : 0.0f;
  return WarpSum(v);
}
__device__ float BlockMax(float v, float* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = WarpMax(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int warps = (blockDim.x + 31) >> 5;
  v = lane < warps ? shared[lane] : -INFINITY;
  return WarpMax(v);
}

__device__ float ToFloat(const void* p, int dtype, int64_t i) {
  if (dtype == static_cast<int>(DType::kF32)) return static_cast<const float*>(p)[i];
  if (dtype == static_cast<int>(DType::kBF16)) {
    return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
  }
  return __half2float(static_cast<const __half*>(p)[i]);
}

// scales: an int8 table's row scales (null for the float types).
__global__ void EmbeddingKernel(const void* table, int dtype, const float* scales, int64_t dim,
                                const int32_t* tokens, float* out) {
  const int64_t token = tokens[blockIdx.x];
  const int64_t row = token * dim;
  float* o = out + blockIdx.x * dim;
  if (scales != nullptr) {  // q * s, as the CPU's DequantizeRowsInt8
    const int8_t* q = static_cast<const int8_t*>(table) + row;
    const float s = scales[token];
    for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) o[j] = static_cast<float>(q[j]) * s;
    return;
  }
  for (int64_t j = threadIdx.x; j < dim; j += blockDim.x) o[j] = ToFloat(table, dtype, row + j);
}

// With kAdd, x += y first (each thread adds, stores and squares its own elements, which it
// alone reads again below, so out may alias x or y): AddKernel then this kernel, in one.
template <bool kAdd>
__global__ void RmsNormKernel(float* x, const float* y, const float* w, int dim, float eps,
                              float* out) {
  __shared__ float shared[32];
  float* xi = x + static_cast<int64_t>(blockIdx.x) * dim;
  float* oi = out + static_cast<int64_t>(blockIdx.x) * dim;
  float ss = 0.0f;
  if (kAdd) {
    const float* yi = y + static_cast<int64_t>(blockIdx.x) * dim;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) xi[j] = xi[j] + yi[j];
  }
  for (int j = threadIdx.x; j < dim; j += blockDim.x) ss += xi[j] * xi[j];
  ss = BlockSum(ss, shared);
  ss /= dim;
  ss += eps;
  ss = 1.0f / sqrtf(ss);
  // Every thread has read its own elements above; writing them is safe when out == x.
  for (int j = threadIdx.x; j < dim; j += blockDim.x) oi[j] = w[j] * (ss * xi[j]);
}

__global__ void RopeKernel(float* x, const int32_t* positions, int n_heads, int head_dim,
                           float theta, int interleaved) {
  const int pairs = head_dim / 2;
  const float pos = static_cast<float>(positions[blockIdx.x]);
  float* row = x + static_cast<int64_t>(blockIdx.x) * n_heads * head_dim;
  for (int k = threadIdx.x; k < n_heads * pairs; k += blockDim.x) {
    const int h = k / pairs, i = k % pairs;
    const float freq = RopeFreq(theta, i, head_dim);
    const float val = pos * freq;
    const float fcr = cosf(val), fci = sinf(val);
    float* v = row + h * head_dim;
    float* p0 = interleaved ? v + 2 * i : v + i;
    float* p1 = interleaved ? p0 + 1 : p0 + pairs;
    const float v0 = *p0, v1 = *p1;
    *p0 = v0 * fcr - v1 * fci;
    *p1 = v0 * fci + v1 * fcr;
  }
}

// One block per key row: each thread rotates pairs by the difference of Rope's float angles
// at the two positions, taken in double (as the host reference). The row is widened into
// shared memory ([head_dim] floats), rotated and stored again with the KV store's rounding;
// an int8 row gets the scale of its rotated values.
__global__ void RerotateKeysKernel(uint8_t* pool, const RerotateRow* rows, int head_dim,
                                   float theta, int interleaved, KvDType dtype) {
  extern __shared__ float row[];
  __shared__ float reduce[32];
  const RerotateRow r = rows[blockIdx.x];
  const int pairs = head_dim / 2;
  const float from = static_cast<float>(r.from), to = static_cast<float>(r.to);
  uint8_t* k = pool + r.k_offset;
  float* scale = reinterpret_cast<float*>(pool + r.scale_offset);
  const float old_scale = dtype == KvDType::kInt8 ? *scale : 1.0f;
  float m = 0.0f;
  for (int i = threadIdx.x; i < pairs; i += blockDim.x) {
    const float freq = RopeFreq(theta, i, head_dim);
    const double angle = static_cast<double>(to * freq) - static_cast<double>(from * freq);
    const float c = static_cast<float>(cos(angle)), s = static_cast<float>(sin(angle));
    const int e0 = interleaved ? 2 * i : i, e1 = interleaved ? e0 + 1 : e0 + pairs;
    const float v0 = KvElem(dtype, k, e0) * old_scale, v1 = KvElem(dtype, k, e1) * old_scale;
    row[e0] = v0 * c - v1 * s;
    row[e1] = v0 * s + v1 * c;
    m = fmaxf(m, fmaxf(fabsf(row[e0]), fabsf(row[e1])));
  }
  float inv = 1.0f;
  if (dtype == KvDType::kInt8) {
    m = BlockMax(m, reduce);
    const float new_scale = m / 127.0f;
    inv = new_scale > 0.0f ? 1.0f / new_scale : 0.0f;
    __syncthreads();  // every thread has read the old scale
    if (threadIdx.x == 0) *scale = new_scale;
  } else {
    __syncthreads();
  }
  for (int e = threadIdx.x; e < head_dim; e += blockDim.x) KvStoreElem(dtype, k, e, row[e], inv);
}

__global__ void AddBiasKernel(float* x, const float* bias, int64_t n_total, int dim) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n_total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    x[i] += bias[i % dim];
  }
}

__global__ void AddKernel(float* x, const float* y, int64_t count) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    x[i] += y[i];
  }
}

__global__ void SiluMulKernel(const float* gate, const float* up, int64_t count, float* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float val = gate[i];
    val *= (1.0f / (1.0f + expf(-val)));
    out[i] = val * up[i];
  }
}

__global__ void SoftmaxKernel(float* x, int cols) {
  __shared__ float shared[32];
  float* row = x + static_cast<int64_t>(blockIdx.x) * cols;
  float m = -INFINITY;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) m = fmaxf(m, row[j]);
  m = BlockMax(m, shared);
  float sum = 0.0f;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) {
    const float e = expf(row[j] - m);
    row[j] = e;
    sum += e;
  }
  sum = BlockSum(sum, shared);
  for (int j = threadIdx.x; j < cols; j += blockDim.x) row[j] /= sum;
}

__global__ void RoundToBf16Kernel(const float* x, int64_t count, __nv_bfloat16* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = __float2bfloat16_rn(x[i]);
  }
}
__global__ void RoundToF16Kernel(const float* x, int64_t count, __half* out) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < count;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = __float2half_rn(x[i]);
  }
}

int RowThreads(int dim) { return std::min(kThreads, std::max(32, (dim + 31) / 32 * 32)); }

}  // namespace

void LaunchEmbedding(const Matrix& table, const int32_t* tokens, int n, float* out,
                     cudaStream_t stream) {
  if (n <= 0) return;
  EmbeddingKernel<<<n, RowThreads(static_cast<int>(table.cols)), 0, stream>>>(
      table.data, static_cast<int>(table.dtype), table.dtype == DType::kI8 ? table.scales : nullptr,
      table.cols, tokens, out);
}

void LaunchRmsNorm(const float* x, const float* weight, int n, int dim, float eps, float* out,
                   cudaStream_t stream) {
  if (n <= 0) return;
  RmsNormKernel<false><<<n, RowThreads(dim), 0, stream>>>(const_cast<float*>(x), nullptr, weight,
                                                           dim, eps, out);
}

void LaunchAddRmsNorm(float* x, const float* y, const float* weight, int n, int dim, float eps,
                      float* out, cudaStream_t stream) {
  if (n <= 0) return;
  RmsNormKernel<true><<<n, RowThreads(dim), 0, stream>>>(x, y, weight, dim, eps, out);
}

void LaunchRope(float* x, const int32_t* positions, int n, int n_heads, int head_dim, float theta,
                RopeStyle style, cudaStream_t stream) {
  if (n <= 0) return;
  RopeKernel<<<n, RowThreads(n_heads * head_dim / 2), 0, stream>>>(
      x, positions, n_heads, head_dim, theta, style == RopeStyle::kInterleaved ? 1 : 0);
}

void LaunchRerotateKeys(uint8_t* pool, const RerotateRow* rows, int n, int head_dim, float theta,
                        RopeStyle style, KvDType dtype, cudaStream_t stream) {
  if (n <= 0) return;
  RerotateKeysKernel<<<n, RowThreads(head_dim / 2), head_dim * sizeof(float), stream>>>(
      pool, rows, head_dim, theta, style == RopeStyle::kInterleaved ? 1 : 0, dtype);
}

void LaunchAddBias(float* x, const float* bias, int n, int dim, cudaStream_t stream) {
  const int64_t total = static_cast<int64_t>(n) * dim;
  if (total <= 0) return;
  AddBiasKernel<<<Blocks(total), kThreads, 0, stream>>>(x, bias, total, dim);
}

void LaunchAdd(float* x, const float* y, int64_t count, cudaStream_t stream) {
  if (count <= 0) return;
  AddKernel<<<Blocks(count), kThreads, 0, stream>>>(x, y, count);
}

void LaunchSiluMul(const float* gate, const float* up, int64_t count, float* out,
                   cudaStream_t stream) {
  if (count <= 0) return;
  SiluMulKernel<<<Blocks(count), kThreads, 0, stream>>>(gate, up, count, out);
}

void LaunchSoftmax(float* x, int rows, int cols, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  SoftmaxKernel<<<rows, RowThreads(cols), 0, stream>>>(x, cols);
}

void LaunchRoundTo(const float* x, int64_t count, DType to, void* out, cudaStream_t stream) {
  if (count <= 0) return;
  if (to == DType::kBF16) {
    RoundToBf16Kernel<<<Blocks(count), kThreads, 0, stream>>>(x, count,
                                                              static_cast<__nv_bfloat16*>(out));
  } else {
    RoundToF16Kernel<<<Blocks(count), kThreads, 0, stream>>>(x, count, static_cast<__half*>(out));
  }
}

}  // namespace recall::kernels::cuda
