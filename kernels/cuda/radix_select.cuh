// RadixThreshold: a threshold selection over 64-bit order keys inside one thread block, by
// radix descent (8 bits per pass over the items), with integer weights, so the result is
// exact and the same on every run. The sampling kernel (top-k, top-p, the draw) and the
// LazyEviction kernel (the top C - W slots) both cut their lists this way instead of sorting.
#pragma once

#include <cstdint>

namespace recall::kernels::cuda {

using u64 = unsigned long long;
constexpr int kRadixBins = 256;

// The block's shared memory for RadixThreshold (kWarps = blockDim.x / 32).
template <int kWarps>
struct RadixShared {
  u64 hist[kWarps][kRadixBins];  // per warp, so lanes of different warps never collide
  u64 bins[kRadixBins];
  int digit;
  u64 above;
};

// Items: `n` items j in [0, n); items.Key(j) returns a value with a u64 member `ord` (the
// order key), and items.Weight(j, key) the item's weight given that value (called only for
// items whose key matches the prefix found so far).
// Returns the largest threshold T such that W(T), the sum of the weights of the items with
// ord >= T, is >= need (> need when strict); *at = W(T) and *above = the weight with
// ord > T. W is non-increasing in T. REQUIRES: W(0) satisfies the test; every thread of the
// block calls it.
template <int kWarps, typename Items>
__device__ u64 RadixThreshold(int n, const Items& items, u64 need, bool strict,
                              RadixShared<kWarps>& sh, u64* at, u64* above_out) {
  const int warp = threadIdx.x >> 5;
  u64 prefix = 0, above = 0, at_t = 0;
  for (int shift = 56; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < kWarps * kRadixBins; i += blockDim.x) {
      (&sh.hist[0][0])[i] = 0;
    }
    __syncthreads();
    const u64 high = shift == 56 ? 0 : ~0ull << (shift + 8);
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
      const auto key = items.Key(j);
      if ((key.ord & high) != prefix) continue;
      const u64 w = items.Weight(j, key);
      if (w != 0) atomicAdd(&sh.hist[warp][(key.ord >> shift) & 0xFF], w);
    }
    __syncthreads();
    if (threadIdx.x < kRadixBins) {
      u64 b = 0;
      for (int w = 0; w < kWarps; ++w) b += sh.hist[w][threadIdx.x];
      sh.bins[threadIdx.x] = b;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      u64 acc = above;
      int digit = -1;
      for (int d = kRadixBins - 1; d >= 0; --d) {
        const u64 with = acc + sh.bins[d];
        if (strict ? with > need : with >= need) {
          digit = d;
          break;
        }
        acc = with;
      }
      if (digit < 0) {  // only if W(0) failed the test: the lowest digit keeps T defined
        digit = 0;
        acc -= sh.bins[0];
      }
      sh.digit = digit;
      sh.above = acc;
    }
    __syncthreads();
    const int digit = sh.digit;
    prefix |= static_cast<u64>(digit) << shift;
    above = sh.above;
    at_t = above + sh.bins[digit];
    __syncthreads();  // sh.bins and sh.digit are rewritten by the next pass
  }
  *at = at_t;
  if (above_out != nullptr) *above_out = above;
  return prefix;
}

}  // namespace recall::kernels::cuda
