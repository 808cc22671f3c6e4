#include "worker/engine/forward.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"

namespace recall::engine {

ForwardPass::ForwardPass(const model::Model& model, kernels::Backend& backend,
                         const ForwardOptions& options)
    : model_(model), backend_(backend), options_(options) {
  const model::ModelConfig& c = model.config;
  const size_t t = static_cast<size_t>(std::max(1, options.max_batch_tokens));
  const size_t q_dim = static_cast<size_t>(c.n_heads) * c.head_dim;
  const size_t kv_dim = static_cast<size_t>(c.n_kv_heads) * c.head_dim;
  x_.resize(t * c.dim);
  xb_.resize(t * std::max<size_t>(c.dim, q_dim));
  q_.resize(t * q_dim);
  k_.resize(t * kv_dim);
  v_.resize(t * kv_dim);
  att_.resize(t * q_dim);
  hb_.resize(t * c.hidden_dim);
  hb2_.resize(t * c.hidden_dim);
  last_.resize(t * c.dim);
  tokens_.resize(t);
  positions_.resize(t);
}

void ForwardPass::MatMul(const float* x, int n, const kernels::Matrix& w, float* y) {
  if (!options_.batch_invariant) {
    backend_.MatMul(x, n, w, y);
    return;
  }
  const int piece = std::max(1, backend_.BatchInvariantRows());
  for (int r = 0; r < n; r += piece) {
    backend_.MatMul(x + static_cast<size_t>(r) * w.cols, std::min(piece, n - r), w,
                    y + static_cast<size_t>(r) * w.rows);
  }
}

absl::Status ForwardPass::AddReduced(float* x, float* y, int total) {
  const int64_t count = static_cast<int64_t>(total) * model_.config.dim;
  if (options_.comm != nullptr) {
    RECALL_RETURN_IF_ERROR(options_.comm->AllReduce(x, count, kernels::ReduceOp::kSum));
  }
  backend_.Add(y, x, count);
  return absl::OkStatus();
}

void ForwardPass::CaptureWindowQueries(std::span<const BatchItem> batch, int layer) {
  const int q_dim = model_.config.n_heads * model_.config.head_dim;
  int off = 0;
  for (const BatchItem& item : batch) {
    if (item.window_queries != nullptr) {
      for (int i = 0; i < item.n; ++i) {
        const int rel = positions_[off + i] - item.window_first;
        if (rel < 0 || rel >= item.window_w) continue;
        std::copy_n(q_.data() + static_cast<size_t>(off + i) * q_dim, q_dim,
                    item.window_queries +
                        (static_cast<size_t>(layer) * item.window_w + rel) * q_dim);
      }
    }
    off += item.n;
  }
}

absl::Status ForwardPass::Run(std::span<const BatchItem> batch, float* logits) {
  const model::ModelConfig& c = model_.config;
  // ---- Validate the whole batch before touching any cache.
  int total = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const BatchItem& item = batch[i];
    if (item.cache == nullptr || item.n <= 0 || item.tokens == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("batch item ", i, ": needs a cache and at least one token"));
    }
    if (item.attn_probs != nullptr && item.n != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("batch item ", i, ": attention probabilities need a decode step (n = 1)"));
    }
    for (int j = 0; j < item.n; ++j) {
      if (item.tokens[j] < 0 || item.tokens[j] >= c.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat("batch item ", i, ": token id ",
                                                       item.tokens[j], " outside [0, ",
                                                       c.vocab_size, ")"));
      }
    }
    if (item.cache->next_position() + item.n > c.max_seq_len) {
      return absl::InvalidArgumentError(absl::StrCat(
          "batch item ", i, ": position ", item.cache->next_position() + item.n,
          " exceeds the model's context length ", c.max_seq_len));
    }
    total += item.n;
  }
  if (total > options_.max_batch_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("batch of ", total,
                                                   " tokens exceeds max_batch_tokens ",
                                                   options_.max_batch_tokens));
  }
  // ---- Reserve cache room; on failure (on any rank) give back what this call took.
  absl::Status reserved = absl::OkStatus();
  size_t n_reserved = 0;
  for (; n_reserved < batch.size() && reserved.ok(); ++n_reserved) {
    reserved = batch[n_reserved].cache->Reserve(batch[n_reserved].n);
  }
  if (!reserved.ok()) --n_reserved;
  const auto give_back = [&] {
    for (size_t j = 0; j < n_reserved; ++j) batch[j].cache->TrimBlocks();
  };
  if (options_.comm != nullptr) {
    int32_t all_ok = reserved.ok() ? 1 : 0;
    absl::Status st = options_.comm->AllReduce(&all_ok, 1, kernels::ReduceOp::kMin);
    if (!st.ok()) {
      give_back();
      return st;
    }
    if (all_ok == 0 && reserved.ok()) {
      reserved = absl::ResourceExhaustedError(
          "KV block pool of another tensor-parallel rank cannot hold the batch");
    }
  }
  if (!reserved.ok()) {
    give_back();
    return reserved;
  }

  // ---- Gather tokens and positions.
  int off = 0;
  for (const BatchItem& item : batch) {
    const int32_t p0 = item.cache->next_position();
    for (int j = 0; j < item.n; ++j) {
      tokens_[off + j] = item.tokens[j];
      positions_[off + j] = p0 + j;
    }
    off += item.n;
  }

  const int dim = c.dim, hd = c.head_dim;
  const int q_dim = c.n_heads * hd, kv_dim = c.n_kv_heads * hd;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  float* x = x_.data();
  backend_.Embedding(model_.tok_embeddings, tokens_.data(), total, x);
  std::vector<int32_t>& kv_lens = kv_lens_;
  kv_lens.resize(static_cast<size_t>(c.n_kv_heads));

  for (int l = 0; l < c.n_layers; ++l) {
    const model::LayerWeights& w = model_.layers[l];
    backend_.RmsNorm(x, w.attn_norm.f32(), total, dim, c.norm_eps, xb_.data());
    MatMul(xb_.data(), total, w.wq, q_.data());
    MatMul(xb_.data(), total, w.wk, k_.data());
    MatMul(xb_.data(), total, w.wv, v_.data());
    if (c.qkv_bias) {
      backend_.AddBias(q_.data(), w.bq.f32(), total, q_dim);
      backend_.AddBias(k_.data(), w.bk.f32(), total, kv_dim);
      backend_.AddBias(v_.data(), w.bv.f32(), total, kv_dim);
    }
    if (c.qk_norm) {
      backend_.RmsNorm(q_.data(), w.q_norm.f32(), total * c.n_heads, hd, c.norm_eps, q_.data());
      backend_.RmsNorm(k_.data(), w.k_norm.f32(), total * c.n_kv_heads, hd, c.norm_eps,
                       k_.data());
    }
    backend_.Rope(q_.data(), positions_.data(), total, c.n_heads, hd, c.rope_theta, c.rope_style);
    backend_.Rope(k_.data(), positions_.data(), total, c.n_kv_heads, hd, c.rope_theta,
                  c.rope_style);
    CaptureWindowQueries(batch, l);

    off = 0;
    for (const BatchItem& item : batch) {
      const kernels::PagedKv kv = item.cache->View();
      const int32_t* lens = item.cache->lengths(l);
      backend_.StoreKv(kv, l, k_.data() + static_cast<size_t>(off) * kv_dim,
                       v_.data() + static_cast<size_t>(off) * kv_dim, item.n, lens);
      for (int h = 0; h < c.n_kv_heads; ++h) kv_lens[h] = lens[h] + item.n;
      const float* q = q_.data() + static_cast<size_t>(off) * q_dim;
      float* out = att_.data() + static_cast<size_t>(off) * q_dim;
      if (item.n == 1) {
        float* probs = item.attn_probs == nullptr
                           ? nullptr
                           : item.attn_probs + static_cast<int64_t>(l) * c.n_heads *
                                                   item.probs_stride;
        backend_.DecodeAttention(kv, l, kv_lens.data(), q, c.n_heads, scale, out, probs,
                                 item.probs_stride);
      } else {
        backend_.PrefillAttention(kv, l, kv_lens.data(), q, item.n, c.n_heads, scale, out);
      }
      off += item.n;
    }

    MatMul(att_.data(), total, w.wo, xb_.data());
    if (absl::Status st = AddReduced(xb_.data(), x, total); !st.ok()) {
      give_back();
      return st;
    }
    backend_.RmsNorm(x, w.ffn_norm.f32(), total, dim, c.norm_eps, xb_.data());
    MatMul(xb_.data(), total, w.w_gate, hb_.data());
    MatMul(xb_.data(), total, w.w_up, hb2_.data());
    backend_.SiluMul(hb_.data(), hb2_.data(), static_cast<int64_t>(total) * c.hidden_dim,
                     hb_.data());
    MatMul(hb_.data(), total, w.w_down, xb_.data());
    if (absl::Status st = AddReduced(xb_.data(), x, total); !st.ok()) {
      give_back();
      return st;
    }
  }

  // ---- Commit the appended tokens to every cache.
  off = 0;
  for (const BatchItem& item : batch) {
    item.cache->CommitAppend(positions_.data() + off, item.n);
    off += item.n;
  }

  // ---- Logits of the last token of each item that wants them.
  int n_out = 0;
  off = 0;
  for (const BatchItem& item : batch) {
    off += item.n;
    if (!item.want_logits) continue;
    std::copy_n(x + static_cast<size_t>(off - 1) * dim, dim,
                last_.data() + static_cast<size_t>(n_out) * dim);
    ++n_out;
  }
  if (n_out > 0 && logits != nullptr) {
    backend_.RmsNorm(last_.data(), model_.final_norm.f32(), n_out, dim, c.norm_eps, last_.data());
    MatMul(last_.data(), n_out, model_.lm_head, logits);
  }
  return absl::OkStatus();
}

}  // namespace recall::engine
