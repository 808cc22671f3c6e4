// Eviction kernels of the CUDA backend: LazyEviction's fused per-step update
// (Backend::LazyObserve) and its eviction step (Backend::LazyEvict). Integer state, a max
// over floats, and scores from kernels/lazy_score.h ranked by their bits: the results equal
// the CPU reference (kernels/cpu/default_ops.cc, kernels/cpu/lazy_evict.cc) bit for bit.
#include <algorithm>

#include "kernels/cuda/kv_access.cuh"
#include "kernels/cuda/launch.h"
#include "kernels/cuda/radix_select.cuh"
#include "kernels/lazy_score.h"

namespace recall::kernels::cuda {
namespace {

// LazyObserveKernel's lengths: in device memory, or carried by the launch itself.
struct LensInMemory {
  const int32_t* old_lens;
  const int32_t* lens;
  __device__ int Old(int r) const { return old_lens[r]; }
  __device__ int Now(int r) const { return lens[r]; }
};
struct LensInLaunch {
  int32_t old_lens[kLazyObserveInlineRows];
  int32_t lens[kLazyObserveInlineRows];
  __device__ int Old(int r) const { return old_lens[r]; }
  __device__ int Now(int r) const { return lens[r]; }
};
// Kernel parameters are at most 4 KB: the lengths and the other arguments must fit.
static_assert(sizeof(LensInLaunch) + 128 <= 4096, "LazyObserve's lengths overflow the launch");

// blockIdx.y: the (layer, KV head) row; the x blocks stride over its slots.
template <typename Lens>
__global__ void LazyObserveKernel(const float* probs, int64_t probs_stride, int n_heads,
                                  int n_kv_heads, int32_t* ts, int32_t* mri,
                                  int64_t state_stride, const Lens lens, float alpha, int t) {
  const int r = blockIdx.y;
  const int layer = r / n_kv_heads, h = r % n_kv_heads;
  const int group = n_heads / n_kv_heads;
  const int len = lens.Now(r), old = lens.Old(r);
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

template <typename Lens>
void LaunchObserve(const LazyObserveArgs& a, const Lens& lens, int max_len, cudaStream_t stream) {
  const int rows = a.n_layers * a.n_kv_heads;
  if (rows <= 0 || max_len <= 0) return;
  constexpr int kThreads = 256;
  const dim3 grid(std::min((max_len + kThreads - 1) / kThreads, 64), rows);
  LazyObserveKernel<<<grid, kThreads, 0, stream>>>(a.probs, a.probs_stride, a.n_heads,
                                                   a.n_kv_heads, a.ts, a.mri, a.state_stride,
                                                   lens, a.alpha, a.t);
}

constexpr int kEvictThreads = 512;
constexpr int kEvictWarps = kEvictThreads / 32;
constexpr int kMoveFloats = 8192;  // the K/V rows one compaction chunk holds
constexpr int kMoveSlots = 256;    // the most slots one chunk holds

// A slot's order key: the bits of its score S >= 0 (for non-negative doubles, larger bits =
// larger value), weight 1.
struct SlotScores {
  const int32_t* ts;
  const int32_t* mri;
  int t;
  struct Keyed {
    u64 ord;
  };
  __device__ Keyed Key(int j) const {
    return {static_cast<u64>(__double_as_longlong(LazyScore(t, ts[j], mri[j])))};
  }
  __device__ u64 Weight(int, const Keyed&) const { return 1; }
};

// Exclusive prefix sum of v over the block (thread order); *total = the sum over the block.
// REQUIRES: blockDim.x == kEvictThreads.
__device__ int BlockExclusiveSum(int v, int* total, int* warp_sums) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int x = v;
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, x, o);
    if (lane >= o) x += y;
  }
  __syncthreads();  // warp_sums may still be read from the last call
  if (lane == 31) warp_sums[warp] = x;
  __syncthreads();
  int before = 0, all = 0;
  for (int w = 0; w < kEvictWarps; ++w) {
    const int s = warp_sums[w];
    before += w < warp ? s : 0;
    all += s;
  }
  *total = all;
  return before + x - v;
}

// One block per evicted row: select the slots to keep (RadixThreshold over the scores of
// [0, len - W), the threshold's ties kept in slot order), write the keep list, then move the
// kept slots' K/V rows, ts and mri down in chunks. keep[i] >= i, so a chunk's sources lie
// at or after its own destinations and before no later chunk's: each chunk reads all its
// sources into shared memory, then writes, and nothing it writes is read again.
__global__ void LazyEvictKernel(uint8_t* pool, PagedKvLayout layout, const LazyEvictRow* rows,
                                const int32_t* tables, int32_t* ts_all, int32_t* mri_all,
                                int64_t state_stride, int32_t* keep_out, int64_t keep_stride,
                                int window, int t) {
  __shared__ union {
    RadixShared<kEvictWarps> radix;
    uint32_t moved[kMoveFloats];
  } sh;
  __shared__ int32_t moved_ts[kMoveSlots], moved_mri[kMoveSlots];
  __shared__ int warp_sums[kEvictWarps];
  const LazyEvictRow row = rows[blockIdx.x];
  int32_t* ts = ts_all + row.row * state_stride;
  int32_t* mri = mri_all + row.row * state_stride;
  int32_t* keep = keep_out + blockIdx.x * keep_stride;
  const int n = row.len - window, k = row.keep - window;
  const SlotScores scores{ts, mri, t};

  u64 threshold = 0, at = 0, above = 0;
  if (k > 0) {
    threshold = RadixThreshold(n, scores, static_cast<u64>(k), false, sh.radix, &at, &above);
  }
  const int ties = k - static_cast<int>(above);  // slots scored exactly `threshold` to keep
  int ties_before = 0, kept_before = 0;
  for (int j0 = 0; j0 < n && k > 0; j0 += blockDim.x) {
    const int j = j0 + threadIdx.x;
    const u64 ord = j < n ? scores.Key(j).ord : 0;
    const bool over = j < n && ord > threshold, tie = j < n && ord == threshold;
    int tie_total = 0, kept_total = 0;
    const int tie_rank = BlockExclusiveSum(tie ? 1 : 0, &tie_total, warp_sums);
    const bool kept = over || (tie && ties_before + tie_rank < ties);
    const int slot = BlockExclusiveSum(kept ? 1 : 0, &kept_total, warp_sums);
    if (kept) keep[kept_before + slot] = j;
    ties_before += tie_total;
    kept_before += kept_total;
  }
  for (int i = threadIdx.x; i < window; i += blockDim.x) keep[k + i] = n + i;
  __syncthreads();  // the keep list is read by every thread below; the scores are all read

  // A slot moves as 32-bit words: its K row, its V row, then (int8) the K and V scales.
  const int bt = layout.block_tokens;
  const int row_words = static_cast<int>(layout.RowBytes() / 4);
  const bool scaled = layout.dtype == KvDType::kInt8;
  const int slot_words = 2 * row_words + (scaled ? 2 : 0);
  const int32_t* table = tables + row.table_begin;
  const auto word = [&](int w, int slot) -> uint32_t* {
    const int32_t block = table[slot / bt];
    if (w < 2 * row_words) {
      const int is_v = w / row_words;
      return reinterpret_cast<uint32_t*>(pool + KvRowOffset(layout, block, row.head, is_v, slot)) +
             (w - is_v * row_words);
    }
    return reinterpret_cast<uint32_t*>(
        pool + KvScaleOffset(layout, block, row.head, w - 2 * row_words, slot));
  };
  const int chunk = min(kMoveFloats / slot_words, kMoveSlots);
  for (int i0 = 0; i0 < row.keep; i0 += chunk) {
    const int m = min(chunk, row.keep - i0);
    for (int e = threadIdx.x; e < m * slot_words; e += blockDim.x) {
      const int i = e / slot_words, w = e % slot_words;
      sh.moved[e] = *word(w, keep[i0 + i]);
    }
    for (int i = threadIdx.x; i < m; i += blockDim.x) {
      moved_ts[i] = ts[keep[i0 + i]];
      moved_mri[i] = mri[keep[i0 + i]];
    }
    __syncthreads();
    for (int e = threadIdx.x; e < m * slot_words; e += blockDim.x) {
      const int i = e / slot_words, w = e % slot_words;
      if (keep[i0 + i] != i0 + i) *word(w, i0 + i) = sh.moved[e];
    }
    for (int i = threadIdx.x; i < m; i += blockDim.x) {
      ts[i0 + i] = moved_ts[i];
      mri[i0 + i] = moved_mri[i];
    }
    __syncthreads();
  }
}

}  // namespace

void LaunchLazyEvict(const LazyEvictArgs& a, const LazyEvictRow* rows, const int32_t* tables,
                     cudaStream_t stream) {
  if (a.n_rows <= 0) return;
  LazyEvictKernel<<<a.n_rows, kEvictThreads, 0, stream>>>(
      static_cast<uint8_t*>(a.kv.pool), a.kv.layout, rows, tables, a.ts, a.mri, a.state_stride,
      a.keep_out, a.keep_stride, a.window, a.t);
}

void LaunchLazyObserve(const LazyObserveArgs& a, const int32_t* old_lens, const int32_t* lens,
                       int max_len, cudaStream_t stream) {
  LaunchObserve(a, LensInMemory{old_lens, lens}, max_len, stream);
}

void LaunchLazyObserveInline(const LazyObserveArgs& a, int max_len, cudaStream_t stream) {
  const int rows = a.n_layers * a.n_kv_heads;
  LensInLaunch lens;
  std::copy(a.old_lens, a.old_lens + rows, lens.old_lens);
  std::copy(a.lens, a.lens + rows, lens.lens);
  LaunchObserve(a, lens, max_len, stream);
}

}  // namespace recall::kernels::cuda
