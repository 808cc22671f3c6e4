// ForwardPass: one transformer step over a batch of sequences of different lengths.
//
// Each batch item is a sequence (its SequenceCache) and the new tokens to run through the
// model: a prefill chunk (n > 1) or a decode step (n = 1). All items' tokens go through the
// matmuls together ([total_tokens, dim] x W^T); attention runs per sequence over its own
// paged cache. New K/V are appended to the caches. Optionally returns the logits of each
// item's last token.
//
// Not thread safe; one ForwardPass per engine thread. Workspaces live in the backend's memory
// (device memory on a GPU), are allocated once for `max_batch_tokens` and reused; the step's
// metadata (tokens, positions, block tables, lengths) is staged on the host and copied to
// the backend in one transfer per step (kernels/kv_batch.h). Host buffers (logits,
// attention probabilities, window queries) are filled by copies out of backend memory.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "cache/sequence_cache.h"
#include "kernels/backend.h"
#include "kernels/comm/communicator.h"
#include "worker/model/model.h"
#include "worker/runtime/step_graphs.h"

namespace recall::runtime {

struct BatchItem {
  cache::SequenceCache* cache = nullptr;
  const int32_t* tokens = nullptr;  // [n]
  int n = 0;
  bool want_logits = true;  // logits of the last token of this item
  // Optional: receives the decode attention probabilities (n must be 1), per layer and query
  // head: probs[(layer * n_heads + qh) * probs_stride + slot]. For eviction policies.
  float* attn_probs = nullptr;
  int64_t probs_stride = 0;
  // Instead of attn_probs (n must be 1): the probabilities stay in the backend's memory, in
  // the pass's scratch, laid out as above with a stride of the item's longest head after the
  // step rounded up to 16; read them with ForwardPass::backend_probs(item) until the next
  // Run. For evictors that step on the backend (SessionEvictor::steps_on_backend()).
  bool probs_on_backend = false;
  // Optional, with want_logits: receives the next token, picked where the logits are
  // (Backend::SampleRows) with `sampling` (null: greedy, the argmax with the lowest id among
  // equal maxima) and `draw`, the uniform number Sample would take from the sequence's Rng.
  // REQUIRES: kernels::SamplesOnBackend(*sampling). When the backend's memory is not host
  // memory, the item's row of Run's `logits` is then not copied out (left as it was). Filled
  // only when Run is given a logits array.
  int32_t* pick = nullptr;
  const kernels::SamplingParams* sampling = nullptr;
  float draw = 0;
  // Optional (SnapKV's observation window): receives the queries (after q/k-norm and RoPE,
  // unscaled) of the tokens at positions [window_first, window_first + window_w), per layer:
  // window_queries[((layer * window_w) + (pos - window_first)) * n_heads * head_dim + ...].
  float* window_queries = nullptr;
  int window_w = 0;
  int window_first = 0;
  // Optional (embeddings, EpiCache): adds to hidden_sum[0, dim) the residual stream after
  // layer `hidden_layer` (0-based: after its MLP) of each of the item's tokens at a position
  // >= hidden_from. On a tensor-parallel rank the residual stream is the full, reduced one.
  float* hidden_sum = nullptr;
  int hidden_layer = -1;
  int hidden_from = 0;
};

struct ForwardOptions {
  int max_batch_tokens = 512;  // upper bound on sum of n over a batch
  // Every row's result independent of the rest of the batch (matmuls split into pieces of
  // Backend::BatchInvariantRows()), so a sequence's greedy output is the same alone or
  // batched. On the CPU the split costs little: a piece of 24 rows streams the weights once,
  // about what sgemm achieves.
  bool batch_invariant = false;
  // Tensor parallelism: this rank's communicator, or null for one rank. With it, the model is
  // a shard (tp/shard.h): the outputs of wo and w_down are partial sums, all-reduced before
  // the residual add, and the ranks agree on cache reservations (if one rank's pool cannot
  // hold the batch, every rank fails the call with ResourceExhausted and changes nothing).
  // Every rank must run the same batch (same tokens, same sequences' positions).
  // `comm` reduces buffers in the backend's memory (the activations: NCCL or a staged group
  // on GPU ranks); `host_comm` reduces host values (the reservation vote). Null host_comm:
  // comm serves both, as on CPU ranks, whose backend memory is host memory.
  kernels::Communicator* comm = nullptr;
  kernels::Communicator* host_comm = nullptr;
  // Decode steps (every item one token, nothing captured to the host mid-step, one rank) run
  // as recorded graphs where the backend can record them (Backend::Record: CUDA graphs; see
  // step_graphs.h). The CPU backend cannot; there this changes nothing.
  bool step_graphs = true;
};

class ForwardPass {
 public:
  // The model's weights must be in the backend's memory (model::UploadModel for a GPU).
  // Allocation failures of the workspaces surface as the status of the first Run.
  ForwardPass(const model::Model& model, kernels::Backend& backend,
              const ForwardOptions& options = {});

  // Runs the batch. `logits` receives [number of items with want_logits, vocab] in batch
  // order. InvalidArgument if the batch exceeds max_batch_tokens, a token id is out of range
  // or a sequence would pass the model's context length; ResourceExhausted if the block pool
  // cannot hold the new tokens (in which case no cache was modified).
  absl::Status Run(std::span<const BatchItem> batch, float* logits);

  // Item `item`'s probabilities of the last Run when it asked for probs_on_backend (else
  // null), in backend memory, and their stride.
  const float* backend_probs(size_t item, int64_t* stride) const;
  // Bytes of the attention probabilities' scratch in backend memory (device backends: it
  // grows with the batches' cache lengths and is kept), counted with the turns' scratch.
  int64_t probs_scratch_bytes() const { return static_cast<int64_t>(probs_.bytes()); }

  const model::Model& model() const { return model_; }
  kernels::Backend& backend() const { return backend_; }
  int max_batch_tokens() const { return options_.max_batch_tokens; }
  const StepGraphs& step_graphs() const { return graphs_; }

 private:
  // y = x * w^T over n rows, split per options_.batch_invariant.
  void MatMul(const float* x, int n, const kernels::Matrix& w, float* y);
  // MatMul of several matrices over the same x (Backend::MatMulMany), split the same way
  // (MatMul is the one-matrix case).
  void MatMulMany(const float* x, int n, std::initializer_list<kernels::Matrix> w,
                  std::initializer_list<float*> y);
  // y += x over the batch's rows, summed over the tensor-parallel ranks first (x is this rank's
  // partial sum). x: [total, dim]. With a norm weight, then normed = RmsNorm(y) in the same
  // op (Backend::AddRmsNorm).
  absl::Status AddReduced(float* x, float* y, int total, const float* norm = nullptr,
                          float* normed = nullptr);
  // Embedding and every layer over the staged batch: the step's ops up to the final norm.
  absl::Status RunLayers(std::span<const BatchItem> batch, int total);
  // Whether the batch's layers may run as a recorded graph (ForwardOptions::step_graphs).
  bool Recordable(std::span<const BatchItem> batch) const;
  // Copies the window queries of items that asked for them (see BatchItem).
  void CaptureWindowQueries(std::span<const BatchItem> batch, int layer);
  // Adds the residual rows of items that asked for layer `layer` to their hidden_sum.
  void CaptureHidden(std::span<const BatchItem> batch, int layer);
  // The final norm and LM head over the n_out rows of last_, into `logits` (host), with the
  // picks of items that asked for them (see BatchItem::pick).
  absl::Status ComputeLogits(std::span<const BatchItem> batch, int n_out, float* logits);
  // Allocates the workspaces (once).
  absl::Status AllocateWorkspaces();
  // Fills the step's metadata and kv_ (KvBatch) for `batch` (caches already reserved) and
  // copies it to backend memory. `total`: the batch's token count. `recordable`: the step
  // runs through graphs_ (the attention grid covers a bucketed length).
  absl::Status StageBatch(std::span<const BatchItem> batch, int total, bool recordable);
  // Grows `buffer` to at least `bytes` (keeps it when large enough); when it must grow, to
  // `slack` times that (buffers that grow step by step, so they move rarely).
  absl::Status Ensure(kernels::Buffer& buffer, size_t bytes, double slack = 1.0);
  float* F(const kernels::Buffer& b) const { return b.as<float>(); }

  const model::Model& model_;
  kernels::Backend& backend_;
  kernels::Memory& memory_;
  ForwardOptions options_;
  absl::Status workspace_status_;
  // Workspaces [max_batch_tokens, ...] in backend memory.
  kernels::Buffer x_, xb_, q_, k_, v_, att_, hb_, hb2_, last_;
  kernels::Buffer logits_, probs_;  // device backends only: grow to the largest batch's need
  kernels::Buffer picks_;           // the picked tokens of the step's logits rows
  std::vector<int32_t> host_picks_;
  std::vector<kernels::SamplingParams> pick_params_;  // per logits row (greedy: no pick)
  std::vector<float> pick_draws_;
  kernels::Buffer meta_, probs_ptrs_, probs_strides_;  // the staged metadata
  // Host staging of the metadata: ints are laid out [tokens | positions | token_item |
  // token_begin | kv_start | table_begin | table_count | tables].
  std::vector<int32_t> host_meta_;
  std::vector<float*> host_probs_;
  std::vector<int64_t> host_probs_strides_;
  std::vector<char> on_backend_;         // per item of the last Run: probs_on_backend
  std::vector<int32_t> host_positions_;  // the step's positions (for commits and captures)
  std::vector<float> host_hidden_;       // CaptureHidden's rows
  kernels::KvBatch kv_;
  const int32_t* tokens_ = nullptr;     // backend memory
  const int32_t* positions_ = nullptr;  // backend memory
  StepGraphs graphs_;
};

// Runs `tokens` (one sequence) into `cache` in forward passes of at most `chunk` tokens.
// logits (may be null): [vocab] of the last token. window_queries (may be null): the queries
// of the last `window_w` tokens, laid out as BatchItem::window_queries. InvalidArgument for
// chunk < 1; otherwise ForwardPass::Run's errors.
absl::Status RunChunked(ForwardPass& forward, cache::SequenceCache* cache,
                        std::span<const int32_t> tokens, int chunk, float* logits,
                        float* window_queries = nullptr, int window_w = 0);

}  // namespace recall::runtime
