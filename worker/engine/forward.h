// ForwardPass: one transformer step over a batch of sequences of different lengths.
//
// Each batch item is a sequence (its SequenceCache) and the new tokens to run through the
// model: a prefill chunk (n > 1) or a decode step (n = 1). All items' tokens go through the
// matmuls together ([total_tokens, dim] x W^T); attention runs per sequence over its own
// paged cache. New K/V are appended to the caches. Optionally returns the logits of each
// item's last token.
//
// Not thread safe; one ForwardPass per engine thread. Workspaces are allocated once for
// `max_batch_tokens` and reused (no allocation per step).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "cache/sequence_cache.h"
#include "kernels/backend.h"
#include "kernels/comm/communicator.h"
#include "worker/model/model.h"

namespace recall::engine {

struct BatchItem {
  cache::SequenceCache* cache = nullptr;
  const int32_t* tokens = nullptr;  // [n]
  int n = 0;
  bool want_logits = true;  // logits of the last token of this item
  // Optional: receives the decode attention probabilities (n must be 1), per layer and query
  // head: probs[(layer * n_heads + qh) * probs_stride + slot]. For eviction policies.
  float* attn_probs = nullptr;
  int64_t probs_stride = 0;
  // Optional (SnapKV's observation window): receives the queries (after q/k-norm and RoPE,
  // unscaled) of the tokens at positions [window_first, window_first + window_w), per layer:
  // window_queries[((layer * window_w) + (pos - window_first)) * n_heads * head_dim + ...].
  float* window_queries = nullptr;
  int window_w = 0;
  int window_first = 0;
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
  kernels::Communicator* comm = nullptr;
};

class ForwardPass {
 public:
  ForwardPass(const model::Model& model, kernels::Backend& backend,
              const ForwardOptions& options = {});

  // Runs the batch. `logits` receives [number of items with want_logits, vocab] in batch
  // order. InvalidArgument if the batch exceeds max_batch_tokens, a token id is out of range
  // or a sequence would pass the model's context length; ResourceExhausted if the block pool
  // cannot hold the new tokens (in which case no cache was modified).
  absl::Status Run(std::span<const BatchItem> batch, float* logits);

  const model::Model& model() const { return model_; }
  kernels::Backend& backend() const { return backend_; }

 private:
  // y = x * w^T over n rows, split per options_.batch_invariant.
  void MatMul(const float* x, int n, const kernels::Matrix& w, float* y);
  // y += x over the batch's rows, summed over the tensor-parallel ranks first (x is this rank's
  // partial sum). x: [total, dim].
  absl::Status AddReduced(float* x, float* y, int total);
  // Copies the window queries of items that asked for them (see BatchItem).
  void CaptureWindowQueries(std::span<const BatchItem> batch, int layer);

  const model::Model& model_;
  kernels::Backend& backend_;
  ForwardOptions options_;
  // Workspaces [max_batch_tokens, ...].
  std::vector<float> x_, xb_, q_, k_, v_, att_, hb_, hb2_, last_;
  std::vector<int32_t> tokens_, positions_, kv_lens_;
};

}  // namespace recall::engine
