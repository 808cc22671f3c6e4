#include "worker/offline/sensitivity.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "absl/strings/str_cat.h"
#include "cache/block_pool.h"
#include "cache/sequence_cache.h"
#include "common/flags.h"
#include "common/status.h"
#include "kernels/kv_rows.h"
#include "worker/runtime/forward.h"

namespace recall::offline {
namespace {

constexpr int kBlockTokens = 16;  // pool block size (slots)

absl::Status Validate(const SensitivityOptions& o, int64_t n, int max_seq_len) {
  if (o.block < 2) {
    return flags::FieldError("block", absl::StrCat(o.block, " must be >= 2"));
  }
  if (o.sinks < 0 || o.sinks >= o.block) {
    return flags::FieldError("sinks",
                             absl::StrCat(o.sinks, " must be in [0, {block} = ", o.block, ")"));
  }
  if (o.window < 1) {
    return flags::FieldError("window", absl::StrCat(o.window, " must be >= 1"));
  }
  if (o.chunk < 1) {
    return flags::FieldError("chunk", absl::StrCat(o.chunk, " must be >= 1"));
  }
  if (n <= o.block) {
    return flags::FieldError("block", absl::StrCat(o.block, " must be below the token count ", n,
                                                   " (only tokens past block 0 are compared)"));
  }
  if (n > max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sensitivity tokens: ", n, " exceed the model's context length ", max_seq_len));
  }
  return absl::OkStatus();
}

// Per (layer, KV head, window): the terms of the cosine of the flattened keys.
class CosineSums {
 public:
  CosineSums(int layers, int heads, int windows)
      : heads_(heads),
        windows_(windows),
        sums_(static_cast<size_t>(layers) * heads * windows * 3, 0.0) {}

  void Add(int layer, int head, int window, const float* full, const float* masked, int dim) {
    double* s = &sums_[((static_cast<size_t>(layer) * heads_ + head) * windows_ + window) * 3];
    for (int i = 0; i < dim; ++i) {
      s[0] += static_cast<double>(full[i]) * masked[i];
      s[1] += static_cast<double>(full[i]) * full[i];
      s[2] += static_cast<double>(masked[i]) * masked[i];
    }
  }

  // Mean over heads and windows of the cosines of `layer`.
  double Mean(int layer) const {
    double total = 0;
    for (int h = 0; h < heads_; ++h) {
      for (int w = 0; w < windows_; ++w) {
        const double* s = &sums_[((static_cast<size_t>(layer) * heads_ + h) * windows_ + w) * 3];
        const double den = std::sqrt(s[1] * s[2]);
        // Two zero vectors are the same; a zero and a non-zero one are unrelated.
        total += den > 0 ? s[0] / den : (s[1] == 0 && s[2] == 0 ? 1.0 : 0.0);
      }
    }
    return total / (static_cast<double>(heads_) * windows_);
  }

 private:
  int heads_, windows_;
  std::vector<double> sums_;  // [layers][heads][windows][dot, |full|^2, |masked|^2]
};

}  // namespace

absl::StatusOr<std::vector<double>> LayerSensitivity(const model::Model& model,
                                                     kernels::Backend& backend,
                                                     std::span<const int32_t> tokens,
                                                     const SensitivityOptions& options) {
  const model::ModelConfig& c = model.config;
  const int64_t n64 = static_cast<int64_t>(tokens.size());
  RECALL_RETURN_IF_ERROR(Validate(options, n64, c.max_seq_len));
  const int n = static_cast<int>(n64);
  const int block = options.block;
  const int half = block / 2;
  const int per_layer = (n + kBlockTokens - 1) / kBlockTokens + 1;
  const kernels::PagedKvLayout layout{c.n_layers, c.n_kv_heads, c.head_dim, kBlockTokens};
  RECALL_ASSIGN_OR_RETURN(
      std::unique_ptr<cache::BlockPool> pool,
      cache::BlockPool::Create(layout, 2 * static_cast<int64_t>(c.n_layers) * per_layer,
                               backend.memory()));
  cache::SequenceCache full(pool.get());
  cache::SequenceCache masked(pool.get());
  if (!full.host_readable()) {
    return absl::FailedPreconditionError(
        "sensitivity: the backend's KV memory is not host readable (run it on the CPU)");
  }
  runtime::ForwardPass forward(model, backend,
                               runtime::ForwardOptions{.max_batch_tokens = options.chunk});
  RECALL_RETURN_IF_ERROR(runtime::RunChunked(forward, &full, tokens, options.chunk, nullptr));

  const int windows = static_cast<int>((int64_t{n} - block + options.window - 1) / options.window);
  CosineSums sums(c.n_layers, c.n_kv_heads, windows);
  std::vector<int32_t> keep;
  for (int begin = 0; begin < n; begin += block) {
    const int end = std::min(n, begin + block);
    RECALL_RETURN_IF_ERROR(runtime::RunChunked(
        forward, &masked, tokens.subspan(static_cast<size_t>(begin), end - begin), options.chunk,
        nullptr));
    const kernels::PagedKv fv = full.View();
    std::vector<float> full_key(static_cast<size_t>(c.head_dim)), masked_key(full_key.size());
    const kernels::PagedKv mv = masked.View();
    const int first_slot = masked.length(0, 0) - (end - begin);  // of position `begin`
    for (int p = std::max(begin, block); p < end; ++p) {
      const int w = (p - block) / options.window;
      for (int l = 0; l < c.n_layers; ++l) {
        for (int h = 0; h < c.n_kv_heads; ++h) {
          kernels::LoadKvRow(fv.Head(l, h), 0, p, full_key.data());
          kernels::LoadKvRow(mv.Head(l, h), 0, first_slot + p - begin, masked_key.data());
          sums.Add(l, h, w, full_key.data(), masked_key.data(), c.head_dim);
        }
      }
    }
    if (end == n) break;
    // What the next block sees: the sinks and this block's last half block.
    keep.clear();
    for (int s = 0; s < masked.length(0, 0); ++s) {
      const int32_t pos = masked.position(0, 0, s);
      if (pos < options.sinks || pos >= end - half) keep.push_back(s);
    }
    for (int l = 0; l < c.n_layers; ++l) {
      for (int h = 0; h < c.n_kv_heads; ++h) masked.Compact(l, h, keep);
    }
    masked.TrimBlocks();
  }
  std::vector<double> sigma(static_cast<size_t>(c.n_layers));
  for (int l = 0; l < c.n_layers; ++l) sigma[static_cast<size_t>(l)] = sums.Mean(l);
  return sigma;
}

}  // namespace recall::offline
