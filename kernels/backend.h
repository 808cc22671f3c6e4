// Backend: every numeric op the transformer runtime needs, behind one interface.
//
// Contract (all ops):
// - Activations are fp32, row-major, caller-owned, in the backend's memory (memory(): host
//   memory on the CPU, device memory on a GPU), as are weights, the KV pool, and the token
//   and position arrays of Embedding and Rope. Host arrays: PagedKv's block tables and
//   counts, kv_lens / start_slots of the per-sequence attention ops, KvBatch's host_ copies,
//   and Sample's logits and history. The backend allocates nothing on the caller's behalf
//   per call beyond its own reusable workspace.
// - Weights (Matrix) may be f32, f16 or bf16; the output is always fp32.
// - Shapes are given as arguments and documented per op as [dim0, dim1, ...].
// - Ops are synchronous on the CPU backend; a GPU backend queues them in order on its stream,
//   and Memory::CopyOut (and Sample) wait for them. A backend instance is used by one thread
//   at a time (it may use its own worker threads inside an op).
// The CPU backend (kernels/cpu) is the reference; every other backend is tested against it.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/kv_batch.h"
#include "kernels/memory.h"
#include "kernels/sampling_params.h"
#include "kernels/tensor.h"

namespace recall::kernels {

// The largest op shapes a caller will use, so a backend can size its workspaces up front.
// Arguments of Backend::LazyObserve. Row r = layer * n_kv_heads + h is one (layer, KV head)
// of one sequence.
struct LazyObserveArgs {
  const float* probs = nullptr;  // [n_layers, n_heads, probs_stride], backend memory
  int64_t probs_stride = 0;
  int n_layers = 0, n_heads = 0, n_kv_heads = 0;
  int32_t* ts = nullptr;   // [n_layers * n_kv_heads, state_stride], backend memory
  int32_t* mri = nullptr;  // same shape
  int64_t state_stride = 0;
  const int32_t* old_lens = nullptr;  // [n_layers * n_kv_heads] host: slots the state held
  const int32_t* lens = nullptr;      // [n_layers * n_kv_heads] host: slots the cache holds now
  float alpha = 0;
  int t = 0;  // the step (>= 1)
};

// Arguments of Backend::LazyEvict: LazyEviction's eviction step (EVICTION.md section 1) for
// n_rows (layer, KV head) rows of one sequence, row r = layer * n_kv_heads + head as above.
struct LazyEvictArgs {
  PagedKv kv;                // the sequence's cache (pool in backend memory, host block tables)
  int32_t* ts = nullptr;     // [n_layers * n_kv_heads, state_stride], backend memory
  int32_t* mri = nullptr;    // same shape
  int64_t state_stride = 0;
  int n_rows = 0;
  const int32_t* rows = nullptr;   // [n_rows] host: the rows to evict, ascending
  const int32_t* lens = nullptr;   // [n_rows] host: slots each holds
  const int32_t* keeps = nullptr;  // [n_rows] host: slots each keeps (C)
  int window = 0;                  // W
  int t = 0;                       // the step
  int32_t* keep_out = nullptr;     // [n_rows, keep_stride] backend memory: the kept slots
  int64_t keep_stride = 0;
};

// Arguments of Backend::RerotateKeys: the cached keys of one sequence move to new positions.
// Row r = layer * n_kv_heads + head holds lens[r] slots; slot s of row r was stored at
// position from[r * stride + s] and moves to to[r * stride + s]. Host arrays.
struct RerotateArgs {
  PagedKv kv;  // the sequence's cache (pool in backend memory, host block tables)
  const int32_t* lens = nullptr;  // [n_layers * n_kv_heads]
  const int32_t* from = nullptr;  // [n_layers * n_kv_heads, stride]
  const int32_t* to = nullptr;    // same shape
  int64_t stride = 0;
  float theta = 10000.0f;
  RopeStyle style = RopeStyle::kInterleaved;
};

// A sequence of a backend's ops recorded once (Backend::Record) and run again as a whole: a
// CUDA graph on a GPU, one launch instead of one per op.
class OpGraph {
 public:
  virtual ~OpGraph() = default;
  // Queues the recorded ops again with the arguments they were recorded with (the same
  // pointers, sizes and scalars; the memory behind the pointers is read as it is now).
  // FailedPrecondition when the backend has since moved a workspace the ops use: the graph is
  // stale, record the ops again.
  virtual absl::Status Replay() = 0;
};

struct WorkspaceNeeds {
  int max_tokens = 0;     // rows of any op (a step's tokens)
  int64_t max_cols = 0;   // the widest MatMul input
  int max_heads = 0;      // query heads
  int head_dim = 0;
  int max_matmul_rows = 0;           // rows of one MatMul call (batch-invariant pieces)
  DType weight_dtype = DType::kF32;  // the layers' linear weights
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* Name() const = 0;

  // Where this backend's ops read and write (see the contract above).
  virtual Memory& memory() { return HostMemory(); }
  // Allocates the workspaces ops of these shapes need (ResourceExhausted when they do not
  // fit); larger shapes later grow them. The CPU backend needs nothing.
  virtual absl::Status ReserveWorkspace(const WorkspaceNeeds& needs) { return absl::OkStatus(); }
  // The first error an op met (a GPU backend's ops are void and asynchronous: a failed launch,
  // a faulted stream or an allocation that failed inside an op shows up here); ok on the CPU.
  virtual absl::Status Health() { return absl::OkStatus(); }

  // Whether Record can record ops (false: it returns null; the CPU backend).
  virtual bool CanRecord() const { return false; }
  // Records the ops `ops` calls on this backend, without running them, into a graph that
  // Replay runs. Null when an op among them cannot be recorded (one that copies to or from
  // the host, allocates or synchronizes): run them directly instead. An error when recording
  // failed. While recording, the ops must not depend on results of ops recorded before them
  // on the host, and everything they point to must still be there when the graph is replayed.
  virtual absl::StatusOr<std::unique_ptr<OpGraph>> Record(absl::FunctionRef<void()> ops) {
    return std::unique_ptr<OpGraph>();
  }

  // out[i, :] = table[tokens[i], :] as fp32.
  // table: [vocab, dim]; tokens: [n]; out: [n, dim]. REQUIRES: 0 <= tokens[i] < vocab.
  virtual void Embedding(const Matrix& table, const int32_t* tokens, int n, float* out) = 0;

  // out[i, :] = x[i, :] / sqrt(mean(x[i, :]^2) + eps) * weight.
  // x, out: [n, dim] (may alias); weight: [dim] fp32.
  virtual void RmsNorm(const float* x, const float* weight, int n, int dim, float eps,
                       float* out) = 0;

  // The residual add and the next RMSNorm in one: x += y, then out = RmsNorm(x). x, y, out:
  // [n, dim]; out may alias y. The same results as Add then RmsNorm (the default, which makes
  // those two calls; a GPU backend launches once).
  virtual void AddRmsNorm(float* x, const float* y, const float* weight, int n, int dim,
                          float eps, float* out);

  // Rotates every head of x in place by its token's position.
  // x: [n, n_heads, head_dim]; positions: [n]; freq_i = theta^(-2i/head_dim).
  virtual void Rope(float* x, const int32_t* positions, int n, int n_heads, int head_dim,
                    float theta, RopeStyle style) = 0;

  // Moves cached keys to new positions in place (a.kv's K rows; V rows are untouched). RoPE is
  // a rotation, so the key Rope stored at position p becomes the key at q by a rotation of
  // angle (q - p) * freq_i per pair; each angle is computed as Rope's float angles at q and p,
  // subtracted in double, so the result is the key Rope would store at q up to the rounding
  // of one cos/sin. The default is a host loop (host-addressable memory); GPU backends rotate
  // on the device.
  virtual void RerotateKeys(const RerotateArgs& args);

  // y = x * w^T.  x: [n, w.cols]; y: [n, w.rows].  Small n uses the GEMV path.
  virtual void MatMul(const float* x, int n, const Matrix& w, float* y) = 0;

  // y[i] = x * w[i]^T for i < count: several projections of one input (q/k/v, gate/up) in
  // one call, each with the results and the batch invariance of its own MatMul. REQUIRES:
  // every w[i] has w[0]'s cols. The default calls MatMul per matrix; a GPU backend may launch
  // once for all of them.
  virtual void MatMulMany(const float* x, int n, const Matrix* w, float* const* y, int count);

  // The most rows one MatMul call may take while each row's result stays bitwise
  // independent of how many other rows are in the call (batch invariance: a sequence's
  // output must not depend on what it is batched with). Callers that need invariance split
  // larger calls into pieces of at most this many rows.
  virtual int BatchInvariantRows() const = 0;
  // Whether MatMul and Embedding take int8 matrices (DType::kI8, their scales and row sums in
  // this backend's memory). False when the backend's int8 kernel failed its start-up check.
  virtual bool RunsInt8Weights() const { return true; }
  // Whether MatMul takes FP8 matrices (DType::kF8E4M3 with their block scales; never
  // Embedding: FP8 checkpoints keep the embeddings in a float type). The CUDA backend only,
  // when its FP8 kernel passed its start-up check; the CPU runs an FP8 checkpoint widened
  // (weight_dtype auto) or requantized (int8) at load.
  virtual bool RunsFp8Weights() const { return false; }

  // x[i, :] += bias.  x: [n, dim]; bias: [dim].
  virtual void AddBias(float* x, const float* bias, int n, int dim) = 0;

  // x += y elementwise.  x, y: [count].
  virtual void Add(float* x, const float* y, int64_t count) = 0;

  // out = silu(gate) * up.  gate, up, out: [count] (out may alias gate).
  virtual void SiluMul(const float* gate, const float* up, int64_t count, float* out) = 0;

  // Row-wise softmax in place.  x: [rows, cols].
  virtual void Softmax(float* x, int rows, int cols) = 0;

  // Writes the K/V rows of n new tokens of one layer into the paged cache, appending at
  // slot start_slots[h] for KV head h.  k, v: [n, n_kv_heads, head_dim]; start_slots:
  // [n_kv_heads].  REQUIRES: the layer's blocks cover start_slots[h] + n slots.
  virtual void StoreKv(const PagedKv& kv, int layer, const float* k, const float* v, int n,
                       const int32_t* start_slots) = 0;

  // Causal attention of n new queries over one sequence's paged cache of one layer, after
  // StoreKv has appended their K/V.  Query i of KV head h's group attends to slots
  // [0, kv_lens[h] - n + i].  GQA: query head qh uses KV head qh / (n_heads / n_kv_heads).
  // q: [n, n_heads, head_dim]; kv_lens: [n_kv_heads]; out: [n, n_heads, head_dim].
  virtual void PrefillAttention(const PagedKv& kv, int layer, const int32_t* kv_lens,
                                const float* q, int n, int n_heads, float scale, float* out) = 0;

  // Attention of one query per head over slots [0, kv_lens[h]) of one sequence and layer.
  // q: [n_heads, head_dim]; out: [n_heads, head_dim].  If probs is not null it receives the
  // softmax probabilities: probs[qh * probs_stride + s] for s < kv_lens[kv head of qh]
  // (the eviction policies consume them; same pass, no recomputation).
  virtual void DecodeAttention(const PagedKv& kv, int layer, const int32_t* kv_lens,
                               const float* q, int n_heads, float scale, float* out,
                               float* probs, int64_t probs_stride) = 0;

  // StoreKv for every item of a step's batch (kernels/kv_batch.h). k, v: [total_tokens,
  // n_kv_heads, head_dim]. The default loops over the items on the host (host_ arrays) and
  // calls StoreKv; GPU backends do the whole batch in one launch.
  virtual void StoreKvBatch(const KvBatch& batch, int layer, const float* k, const float* v);

  // PrefillAttention / DecodeAttention for every item of the batch, after StoreKvBatch: an
  // item with one new token is a decode step (with its probs, if asked for), others are
  // prefill chunks. q, out: [total_tokens, n_heads, head_dim]. Same loop as above by default.
  virtual void AttentionBatch(const KvBatch& batch, int layer, const float* q, int n_heads,
                              float scale, float* out);

  // LazyEviction's per-step state update (EVICTION.md section 1) of every (layer, KV head)
  // row of one sequence, fused into one pass: slots [old_lens[r], lens[r]) are appended
  // (ts = t - 1, mri = 0); then slot j < lens[r] is important iff the max over the head's
  // query group (GQA) of probs[(layer * n_heads + qh) * probs_stride + j] is >= alpha, and
  // an important slot gets mri = max(mri, t - ts), ts = t. The same arithmetic as
  // AppendSlots + ReduceGqaMax + LazyPolicy::Observe on the host.
  // REQUIRES: old_lens[r] <= lens[r] <= min(probs_stride, state_stride); n_heads a multiple
  // of n_kv_heads. The default is a host loop (host-addressable memory); GPU backends run it
  // on the device, so the probabilities never leave it.
  virtual void LazyObserve(const LazyObserveArgs& args);

  // LazyEviction's eviction of every listed row at step t, selection and compaction in one:
  // the slots [0, len - W) are ranked by S = LazyScore(t, ts, mri) (kernels/lazy_score.h),
  // highest first and the older slot first among equal scores, and the top C - W of them are
  // kept with the last W slots. keep_out[i, 0 .. C) receives row i's kept slots, ascending;
  // its K and V rows in the cache and its ts and mri move down to slots [0, C) in that order
  // (the rest of the row is left as is). The same choice as LazyPolicy::SelectKeep without
  // value protection. REQUIRES: W <= C < len <= state_stride, keep_stride >= C, rows distinct.
  // The default is a host loop (kernels/cpu/lazy_evict.h; host-addressable memory); GPU
  // backends select and compact on the device, so only the keep lists need to reach the host.
  virtual void LazyEvict(const LazyEvictArgs& args);

  // out[r] = the index of the largest of x[r, 0 .. cols), the lowest index among equal
  // maxima: Sample's greedy choice. x: [rows, cols]; out: [rows]; both in backend memory.
  // For finite x (a NaN is never picked, except at index 0 as the host loop does).
  virtual void ArgmaxRows(const float* x, int rows, int cols, int32_t* out);

  // Sample's choice for every row of x [rows, cols] (backend memory, read only), picked where
  // the logits are: row r with params[r] and the uniform draw draws[r] in [0, 1) that Sample
  // would have taken from the sequence's Rng (unused for a greedy row, whose pick is
  // ArgmaxRows': a GPU backend runs that kernel when every row is greedy); out: [rows], backend
  // memory. params and draws are host arrays. REQUIRES: SamplesOnBackend(params[r]) (no
  // repetition penalty). The default is cpu::Sampler::Pick per row (host-addressable memory):
  // the reference. A GPU backend ranks and sums the same way in integer arithmetic, so its
  // choice differs from the reference only where the draw lies within float rounding of a
  // boundary between two candidates' cumulative masses.
  virtual void SampleRows(const float* x, int rows, int cols, const SamplingParams* params,
                          const float* draws, int32_t* out);

  // Picks the next token from logits [vocab] (modified in place: penalties, temperature).
  // history: [n_history] tokens already in the sequence, for the repetition penalty.
  virtual int32_t Sample(float* logits, int vocab, const SamplingParams& params, Rng& rng,
                         const int32_t* history, int n_history) = 0;

 private:
  // The default batch ops' per-item view of one layer (grow-once scratch).
  PagedKv ItemView(const KvBatch& batch, int item, int layer);
  std::vector<const int32_t*> item_tables_;
  std::vector<int32_t> item_counts_, item_lens_;
};

struct CpuBackendOptions {
  int num_threads = 0;  // 0 = hardware concurrency
  // Testing: memory() is OpaqueHostMemory() (host memory that says it is not host-accessible),
  // so the code written for device memory runs on the CPU: every crossing through
  // CopyIn / CopyOut, staged collectives, probabilities and logits copied back.
  bool opaque_memory = false;
};

// The CPU backend; always available.
std::unique_ptr<Backend> CreateCpuBackend(const CpuBackendOptions& options = {});

}  // namespace recall::kernels
