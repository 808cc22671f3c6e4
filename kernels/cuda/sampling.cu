// Sampling kernels of the CUDA backend: the greedy choice (Backend::ArgmaxRows) and
// temperature / top-k / top-p sampling with the host's draw (Backend::SampleRows), so a
// decode step copies one token id per sequence to the host instead of its logits.
//
// SampleRows follows cpu::Sampler::Pick without sorting. Each token j gets an order key
//   ord_j = (ordered bits of its scaled logit x_j / T) << 32 | (2^32 - 1 - j),
// unique per token, larger = earlier in Pick's ranking (larger scaled logit, then lower id).
// Without top-k and top-p, Pick walks the tokens in id order instead, and ord_j is
// 2^32 - 1 - j alone. Every set Pick cuts from its list (the top k, the top-p nucleus, the
// prefix the draw lands in) is then {j : ord_j >= threshold}, and each threshold is found by a radix descent
// over ord (8 bits per pass) with the weights summed as integers: a probability is held in
// fixed point (2^-40 units), so every sum is exact and the same whatever the order. The
// choice is deterministic, and equals Pick's except where the draw lies within float
// rounding of a boundary of Pick's float cumulative sums.
#include <cstdint>

#include "kernels/cuda/launch.h"
#include "kernels/cuda/radix_select.cuh"

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

constexpr int kSampleThreads = 512;
constexpr int kSampleWarps = kSampleThreads / 32;
constexpr double kFixedOne = 1099511627776.0;  // 2^40: a probability of 1 in fixed point


// Monotone map of a float's order to unsigned order (-0 is made +0 first, as they compare
// equal).
__device__ inline uint32_t OrderedBits(float v) {
  const uint32_t b = __float_as_uint(v + 0.0f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ inline u64 Ord(float scaled, int j) {
  return (static_cast<u64>(OrderedBits(scaled)) << 32) | (0xFFFFFFFFu - static_cast<uint32_t>(j));
}

__device__ inline int TokenOf(u64 ord) { return static_cast<int>(0xFFFFFFFFu - (ord & 0xFFFFFFFFu)); }

// The block's combination of every thread's v (all threads get it; the same order of
// operations on every run).
template <typename T, typename Op>
__device__ T BlockAll(T v, Op op, T* scratch) {
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();  // scratch may still be read from the last call
  if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
  __syncthreads();
  v = scratch[0];
  for (int w = 1; w < kSampleWarps; ++w) v = op(v, scratch[w]);
  return v;
}

struct MaxF {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumF {
  __device__ float operator()(float a, float b) const { return a + b; }
};
struct MaxU {
  __device__ u64 operator()(u64 a, u64 b) const { return a > b ? a : b; }
};
struct SumU {
  __device__ u64 operator()(u64 a, u64 b) const { return a + b; }
};

struct SampleShared {
  RadixShared<kSampleWarps> radix;
  u64 uscratch[kSampleWarps];
  float fscratch[kSampleWarps];
};

// One row's view: scaled logits, probabilities, order keys.
struct Row {
  const float* x;
  int cols;
  float temperature;
  float max_scaled;
  float sum;  // of expf(scaled - max_scaled)
  bool ranked;  // top-k or top-p: Pick's list is sorted (else in id order)
  __device__ float Scaled(int j) const { return x[j] / temperature; }
  __device__ u64 Key(float scaled, int j) const {
    return ranked ? Ord(scaled, j) : 0xFFFFFFFFull - static_cast<uint32_t>(j);
  }
  __device__ float Prob(float scaled) const { return expf(scaled - max_scaled) / sum; }
  __device__ u64 Fixed(float scaled) const {
    return __double2ull_rn(static_cast<double>(Prob(scaled)) * kFixedOne);
  }
};

// Weights of SelectThreshold: (token, its order key, its scaled logit) -> weight.
struct CountWeight {
  __device__ u64 operator()(int, u64, float) const { return 1; }
};
// The fixed-point probability of a candidate: order key at or above `threshold` and
// probability at or above `min_prob`; 0 for the rest.
struct CandidateMass {
  Row row;
  u64 threshold;
  float min_prob;
  __device__ u64 operator()(int, u64 o, float scaled) const {
    if (o < threshold) return 0;
    const float p = row.Prob(scaled);
    return p < min_prob ? 0 : __double2ull_rn(static_cast<double>(p) * kFixedOne);
  }
};

// Sampling's items for RadixThreshold: the row's tokens with their order keys, weighed by
// `weight(token, order key, scaled logit)`.
template <typename WeightFn>
struct RowItems {
  const Row& row;
  WeightFn weight;
  struct Keyed {
    u64 ord;
    float scaled;
  };
  __device__ Keyed Key(int j) const {
    const float scaled = row.Scaled(j);
    return {row.Key(scaled, j), scaled};
  }
  __device__ u64 Weight(int j, const Keyed& k) const { return weight(j, k.ord, k.scaled); }
};

// RadixThreshold over the row's tokens (radix_select.cuh); *mass = W(T).
template <typename Weight>
__device__ u64 SelectThreshold(const Row& row, Weight weight, u64 need, bool strict,
                               SampleShared& sh, u64* mass) {
  return RadixThreshold(row.cols, RowItems<Weight>{row, weight}, need, strict, sh.radix, mass,
                        nullptr);
}

// SampleRowsKernel's rows: in device memory, or carried by the launch itself.
struct PicksInMemory {
  const RowPick* picks;
  __device__ RowPick operator[](int r) const { return picks[r]; }
};
struct PicksInLaunch {
  RowPick picks[kSampleRowsInlineRows];
  __device__ RowPick operator[](int r) const { return picks[r]; }
};
// Kernel parameters are at most 4 KB: the rows and the other arguments must fit.
static_assert(sizeof(PicksInLaunch) + 64 <= 4096, "SampleRows' rows overflow the launch");

// Greedy: the largest order key of the raw logits is the argmax, lowest id among equals.
// NaNs are skipped (their order key would rank above +inf); a row of NaNs picks token 0.
__device__ int GreedyPick(const float* x, int cols, SampleShared& sh) {
  u64 best = 0;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) {
    if (!isnan(x[j])) best = max(best, Ord(x[j], j));
  }
  best = BlockAll(best, MaxU(), sh.uscratch);
  return best == 0 ? 0 : TokenOf(best);
}

template <typename Picks>
__global__ void SampleRowsKernel(const float* x, int cols, const Picks picks, int32_t* out) {
  __shared__ SampleShared sh;
  const RowPick pick = picks[blockIdx.x];
  Row row;
  row.x = x + static_cast<int64_t>(blockIdx.x) * cols;
  row.cols = cols;
  if (!(pick.temperature > 0.0f)) {
    const int token = GreedyPick(row.x, cols, sh);
    if (threadIdx.x == 0) out[blockIdx.x] = token;
    return;
  }
  row.temperature = pick.temperature;
  // Softmax of the scaled logits (Pick: logits /= T, then softmax).
  float m = -INFINITY;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) m = fmaxf(m, row.Scaled(j));
  row.max_scaled = BlockAll(m, MaxF(), sh.fscratch);
  float z = 0.0f;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) z += expf(row.Scaled(j) - row.max_scaled);
  row.sum = BlockAll(z, SumF(), sh.fscratch);

  // The candidates: the top k, or (top-p without top-k) the tokens at or above run.c's cutoff.
  const bool use_top_k = pick.top_k > 0 && pick.top_k < cols;
  const bool use_top_p = pick.top_p > 0.0f && pick.top_p < 1.0f;
  row.ranked = use_top_k || use_top_p;
  u64 k_threshold = 0, unused = 0;
  if (use_top_k) {
    k_threshold =
        SelectThreshold(row, CountWeight(), static_cast<u64>(pick.top_k), false, sh, &unused);
  }
  const float cutoff =
      (!use_top_k && use_top_p && cols > 1) ? (1.0f - pick.top_p) / (cols - 1) : 0.0f;
  u64 count = 0, mass = 0;
  for (int j = threadIdx.x; j < cols; j += blockDim.x) {
    const float scaled = row.Scaled(j);
    if (row.Key(scaled, j) < k_threshold || row.Prob(scaled) < cutoff) continue;
    ++count;
    mass += row.Fixed(scaled);
  }
  count = BlockAll(count, SumU(), sh.uscratch);
  mass = BlockAll(mass, SumU(), sh.uscratch);
  float min_prob = cutoff;
  if (count == 0) {  // nothing at the cutoff: every token is a candidate (as Pick)
    min_prob = 0.0f;
    for (int j = threadIdx.x; j < cols; j += blockDim.x) mass += row.Fixed(row.Scaled(j));
    mass = BlockAll(mass, SumU(), sh.uscratch);
  }
  CandidateMass candidate{row, k_threshold, min_prob};
  // The nucleus: the smallest most-likely prefix of the candidates whose mass reaches top_p
  // of theirs.
  if (use_top_p) {
    const u64 need = static_cast<u64>(ceil(static_cast<double>(pick.top_p) * mass));
    candidate.threshold = SelectThreshold(row, candidate, need, false, sh, &mass);
  }
  if (mass == 0) {  // NaN or overflowing logits left no mass to draw from: a valid id anyway
    const int token = GreedyPick(row.x, cols, sh);
    if (threadIdx.x == 0) out[blockIdx.x] = token;
    return;
  }
  // The draw: the first token, most likely first, whose cumulative mass passes draw * mass.
  const u64 r = static_cast<u64>(static_cast<double>(pick.draw) * static_cast<double>(mass));
  const u64 chosen = SelectThreshold(row, candidate, r, true, sh, &unused);
  if (threadIdx.x == 0) out[blockIdx.x] = TokenOf(chosen);
}

}  // namespace

void LaunchSampleRows(const float* x, int rows, int cols, const RowPick* picks, int32_t* out,
                      cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  SampleRowsKernel<<<rows, kSampleThreads, 0, stream>>>(x, cols, PicksInMemory{picks}, out);
}

void LaunchSampleRowsInline(const float* x, int rows, int cols, const RowPick* host_picks,
                            int32_t* out, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  PicksInLaunch picks;
  for (int r = 0; r < rows; ++r) picks.picks[r] = host_picks[r];
  SampleRowsKernel<<<rows, kSampleThreads, 0, stream>>>(x, cols, picks, out);
}

void LaunchArgmaxRows(const float* x, int rows, int cols, int32_t* out, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return;
  ArgmaxRowsKernel<<<rows, kThreads, 0, stream>>>(x, cols, out);
}

}  // namespace recall::kernels::cuda
