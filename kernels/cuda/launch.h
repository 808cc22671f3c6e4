// Launchers of the CUDA backend's kernels (kernels/cuda/*.cu). Each queues its kernel on
// `stream` and returns at once; launch errors are read by the caller (cudaGetLastError).
// Pointers are device memory unless a comment says otherwise. Shapes as in kernels/backend.h.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/backend.h"
#include "kernels/kv_batch.h"
#include "kernels/tensor.h"

namespace recall::kernels::cuda {

// ---- elementwise.cu
void LaunchEmbedding(const Matrix& table, const int32_t* tokens, int n, float* out,
                     cudaStream_t stream);
void LaunchRmsNorm(const float* x, const float* weight, int n, int dim, float eps, float* out,
                   cudaStream_t stream);
// x += y, then out = RmsNorm(x) (Backend::AddRmsNorm).
void LaunchAddRmsNorm(float* x, const float* y, const float* weight, int n, int dim, float eps,
                      float* out, cudaStream_t stream);
void LaunchRope(float* x, const int32_t* positions, int n, int n_heads, int head_dim, float theta,
                RopeStyle style, cudaStream_t stream);
void LaunchAddBias(float* x, const float* bias, int n, int dim, cudaStream_t stream);
void LaunchAdd(float* x, const float* y, int64_t count, cudaStream_t stream);
void LaunchSiluMul(const float* gate, const float* up, int64_t count, float* out,
                   cudaStream_t stream);
void LaunchSoftmax(float* x, int rows, int cols, cudaStream_t stream);
// out[i] = x[i] rounded to `to` (kBF16 or kF16). out: [count] of 2-byte elements.
void LaunchRoundTo(const float* x, int64_t count, DType to, void* out, cudaStream_t stream);

// ---- matmul.cu
// Backend::MatMul / MatMulMany for few rows (kernels/cuda/matmul.cu): batch-invariant, weights
// read once per 16 rows, x in fp32 (not rounded to the weights' type); y[i] = x * w[i]^T for
// i < count. chunks_in_flight: how many of its chunks of 8 weights each lane loads before
// their FMAs at up to 4 rows (1, 2 or 4; 0: DefaultChunksInFlight); every count gives the same
// bits. REQUIRES: count <= kMaxProjections; every w[i] of w[0]'s dtype and cols;
// ValidChunksInFlight(chunks_in_flight).
constexpr int kMaxProjections = 3;
void LaunchSkinnyMatMul(const float* x, int n, const Matrix* w, float* const* y, int count,
                        int chunks_in_flight, cudaStream_t stream);
bool ValidChunksInFlight(int chunks_in_flight);
int DefaultChunksInFlight(DType weights);

// ---- fp8_gemm_inputs.cu (the inputs of kernels/cuda/fp8_gemm.h's cuBLASLt call)
// q [n, cols] = E4M3(x / scale) per row and block of 128 columns, scale = the block's largest
// |x| / 448 stored at scales[block * n + row]. REQUIRES: cols % 128 == 0, x 16-byte aligned.
void LaunchQuantizeE4M3Rows(const float* x, int n, int64_t cols, uint8_t* q, float* scales,
                            cudaStream_t stream);
// out [blocks, rows] = in [rows, blocks] transposed.
void LaunchTransposeScales(const float* in, int64_t rows, int64_t blocks, float* out,
                           cudaStream_t stream);
// out[i] = in[i] (bf16) widened to fp32.
void LaunchWidenBf16(const void* in, int64_t count, float* out, cudaStream_t stream);

// ---- attention.cu
// Appends the batch's K/V rows (Backend::StoreKvBatch).
void LaunchStoreKv(const KvBatch& batch, int layer, const float* k, const float* v,
                   cudaStream_t stream);

// Scratch of LaunchAttention: `partials` holds AttentionPartialFloats(...) floats, `stats`
// 2 floats per (token, query head).
struct AttentionScratch {
  float* partials = nullptr;
  int64_t partial_floats = 0;
  float* stats = nullptr;
  int64_t stat_floats = 0;
  int sm_count = 1;
};
// Floats of `partials` any batch of up to max_tokens tokens and max_heads heads needs.
int64_t AttentionPartialFloats(int max_tokens, int max_heads, int head_dim, int sm_count);
// Split-KV attention of every token of the batch (Backend::AttentionBatch), with the decode
// items' probabilities when asked for. REQUIRES: head_dim <= 256, n_heads % n_kv_heads == 0.
void LaunchAttention(const KvBatch& batch, int layer, const float* q, int n_heads, float scale,
                     float* out, const AttentionScratch& scratch, cudaStream_t stream);

// One row move of cache compaction: byte offsets from the pool's base of the source and the
// destination K row and (int8) K scale; the V row and scale are one plane further.
struct RowMove {
  int64_t src_row = 0, dst_row = 0, src_scale = 0, dst_scale = 0;
};
// Moves the K/V rows (and scales) of `m` moves in device memory. Rows are first gathered into
// `scratch` ([m, 2 * RowBytes / 4 + 2] words), so moves may overlap.
void LaunchMoveRows(uint8_t* base, const RowMove* moves, int m, const PagedKvLayout& layout,
                    uint32_t* scratch, cudaStream_t stream);

// One key row of Backend::RerotateKeys, staged in device memory: the K row at `k_offset`
// bytes from the pool's base (its int8 scale at `scale_offset`) moves from position `from` to
// `to`.
struct RerotateRow {
  int64_t k_offset = 0, scale_offset = 0;
  int32_t from = 0, to = 0;
};
// Backend::RerotateKeys over `n` rows of a pool of type `dtype`.
void LaunchRerotateKeys(uint8_t* pool, const RerotateRow* rows, int n, int head_dim, float theta,
                        RopeStyle style, KvDType dtype, cudaStream_t stream);

// ---- sampling.cu
// Backend::ArgmaxRows.
void LaunchArgmaxRows(const float* x, int rows, int cols, int32_t* out, cudaStream_t stream);
// One row's SamplingParams (less the repetition penalty) and its draw, in device memory.
struct RowPick {
  float temperature = 0;
  int top_k = 0;
  float top_p = 1;
  float draw = 0;
};
// Backend::SampleRows: picks[r] for row r of x [rows, cols].
void LaunchSampleRows(const float* x, int rows, int cols, const RowPick* picks, int32_t* out,
                      cudaStream_t stream);
// The most rows whose RowPicks a launch can carry as its arguments.
constexpr int kSampleRowsInlineRows = 240;
// LaunchSampleRows with the picks read from the host into the launch's arguments: nothing to
// stage, no wait for the stream. REQUIRES: rows <= kSampleRowsInlineRows.
void LaunchSampleRowsInline(const float* x, int rows, int cols, const RowPick* host_picks,
                            int32_t* out, cudaStream_t stream);

// ---- eviction.cu
// Backend::LazyObserve with the lengths in device memory (`old_lens`, `lens`; args' host
// pointers are not read); max_len: the largest of lens.
void LaunchLazyObserve(const LazyObserveArgs& args, const int32_t* old_lens, const int32_t* lens,
                       int max_len, cudaStream_t stream);
// The most rows (n_layers * n_kv_heads) whose lengths a launch can carry as its arguments.
constexpr int kLazyObserveInlineRows = 480;
// Backend::LazyObserve with args' host lengths copied into the launch's arguments: nothing to
// stage, no wait for the stream. REQUIRES: n_layers * n_kv_heads <= kLazyObserveInlineRows.
void LaunchLazyObserveInline(const LazyObserveArgs& args, int max_len, cudaStream_t stream);
// One row of Backend::LazyEvict, staged in device memory: state row `row` = layer *
// n_kv_heads + head; its layer's block ids start at tables[table_begin].
struct LazyEvictRow {
  int32_t row = 0, head = 0, len = 0, keep = 0, table_begin = 0;
};
// Backend::LazyEvict with the rows (args.n_rows of them) and the block tables in device
// memory (args' host arrays are not read). REQUIRES: head_dim <= 256.
void LaunchLazyEvict(const LazyEvictArgs& args, const LazyEvictRow* rows, const int32_t* tables,
                     cudaStream_t stream);

}  // namespace recall::kernels::cuda
