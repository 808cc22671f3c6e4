#include "worker/runtime/forward.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"

namespace recall::runtime {

ForwardPass::ForwardPass(const model::Model& model, kernels::Backend& backend,
                         const ForwardOptions& options)
    : model_(model),
      backend_(backend),
      memory_(backend.memory()),
      options_(options),
      graphs_(backend) {
  workspace_status_ = AllocateWorkspaces();
}

absl::Status ForwardPass::Ensure(kernels::Buffer& buffer, size_t bytes, double slack) {
  if (buffer.get() != nullptr && buffer.bytes() >= bytes) return absl::OkStatus();
  buffer = kernels::Buffer();  // free first: device memory is the scarce resource
  const size_t want = std::max(bytes, static_cast<size_t>(static_cast<double>(bytes) * slack));
  RECALL_ASSIGN_OR_RETURN(buffer, kernels::Buffer::Allocate(memory_, want));
  return absl::OkStatus();
}

absl::Status ForwardPass::AllocateWorkspaces() {
  const model::ModelConfig& c = model_.config;
  const size_t t = static_cast<size_t>(std::max(1, options_.max_batch_tokens));
  const size_t q_dim = static_cast<size_t>(c.n_heads) * c.head_dim;
  const size_t kv_dim = static_cast<size_t>(c.n_kv_heads) * c.head_dim;
  const size_t f = sizeof(float);
  RECALL_RETURN_IF_ERROR(Ensure(x_, t * c.dim * f));
  RECALL_RETURN_IF_ERROR(Ensure(xb_, t * std::max<size_t>(c.dim, q_dim) * f));
  RECALL_RETURN_IF_ERROR(Ensure(q_, t * q_dim * f));
  RECALL_RETURN_IF_ERROR(Ensure(k_, t * kv_dim * f));
  RECALL_RETURN_IF_ERROR(Ensure(v_, t * kv_dim * f));
  RECALL_RETURN_IF_ERROR(Ensure(att_, t * q_dim * f));
  RECALL_RETURN_IF_ERROR(Ensure(hb_, t * c.hidden_dim * f));
  RECALL_RETURN_IF_ERROR(Ensure(hb2_, t * c.hidden_dim * f));
  RECALL_RETURN_IF_ERROR(Ensure(last_, t * c.dim * f));
  host_positions_.resize(t);
  kernels::WorkspaceNeeds needs;
  needs.max_tokens = static_cast<int>(t);
  needs.max_cols = std::max<int64_t>({c.dim, static_cast<int64_t>(q_dim), c.hidden_dim});
  needs.max_heads = c.n_heads;
  needs.head_dim = c.head_dim;
  needs.max_matmul_rows =
      options_.batch_invariant
          ? std::min<int>(needs.max_tokens, std::max(1, backend_.BatchInvariantRows()))
          : needs.max_tokens;
  needs.weight_dtype = c.weight_dtype;
  return backend_.ReserveWorkspace(needs);
}

void ForwardPass::MatMul(const float* x, int n, const kernels::Matrix& w, float* y) {
  MatMulMany(x, n, {w}, {y});
}

void ForwardPass::MatMulMany(const float* x, int n, std::initializer_list<kernels::Matrix> w,
                             std::initializer_list<float*> y) {
  const kernels::Matrix* ws = w.begin();
  const int count = static_cast<int>(w.size());
  RECALL_CHECK(count <= 3 && y.size() == w.size()) << "MatMulMany: up to 3 matrices";
  const int piece = options_.batch_invariant ? std::max(1, backend_.BatchInvariantRows()) : n;
  for (int r = 0; r < n; r += piece) {
    float* out[3];
    for (int i = 0; i < count; ++i) out[i] = y.begin()[i] + static_cast<size_t>(r) * ws[i].rows;
    backend_.MatMulMany(x + static_cast<size_t>(r) * ws[0].cols, std::min(piece, n - r), ws, out,
                        count);
  }
}

absl::Status ForwardPass::AddReduced(float* x, float* y, int total, const float* norm,
                                     float* normed) {
  const model::ModelConfig& c = model_.config;
  const int64_t count = static_cast<int64_t>(total) * c.dim;
  if (options_.comm != nullptr) {
    RECALL_RETURN_IF_ERROR(options_.comm->AllReduce(x, count, kernels::ReduceOp::kSum));
  }
  if (norm == nullptr) {
    backend_.Add(y, x, count);
  } else {
    backend_.AddRmsNorm(y, x, norm, total, c.dim, c.norm_eps, normed);
  }
  return absl::OkStatus();
}

void ForwardPass::CaptureHidden(std::span<const BatchItem> batch, int layer) {
  const int dim = model_.config.dim;
  int off = 0;
  for (const BatchItem& item : batch) {
    if (item.hidden_sum != nullptr && item.hidden_layer == layer) {
      host_hidden_.resize(static_cast<size_t>(item.n) * dim);
      memory_.CopyOut(host_hidden_.data(), F(x_) + static_cast<size_t>(off) * dim,
                      host_hidden_.size() * sizeof(float));
      for (int i = 0; i < item.n; ++i) {
        if (host_positions_[off + i] < item.hidden_from) continue;
        const float* row = host_hidden_.data() + static_cast<size_t>(i) * dim;
        for (int d = 0; d < dim; ++d) item.hidden_sum[d] += row[d];
      }
    }
    off += item.n;
  }
}

void ForwardPass::CaptureWindowQueries(std::span<const BatchItem> batch, int layer) {
  const int q_dim = model_.config.n_heads * model_.config.head_dim;
  int off = 0;
  for (const BatchItem& item : batch) {
    if (item.window_queries != nullptr) {
      for (int i = 0; i < item.n; ++i) {
        const int rel = host_positions_[off + i] - item.window_first;
        if (rel < 0 || rel >= item.window_w) continue;
        memory_.CopyOut(
            item.window_queries + (static_cast<size_t>(layer) * item.window_w + rel) * q_dim,
            F(q_) + static_cast<size_t>(off + i) * q_dim, q_dim * sizeof(float));
      }
    }
    off += item.n;
  }
}

absl::Status ForwardPass::StageBatch(std::span<const BatchItem> batch, int total, bool recordable) {
  const model::ModelConfig& c = model_.config;
  const int n_items = static_cast<int>(batch.size());
  const int n_layers = c.n_layers, n_kv = c.n_kv_heads;
  // Sizes of the int sections.
  size_t n_tables = 0;
  for (const BatchItem& item : batch) n_tables += static_cast<size_t>(item.cache->num_blocks());
  const size_t il = static_cast<size_t>(n_items) * n_layers;
  const size_t o_tokens = 0, o_pos = o_tokens + total, o_item = o_pos + total,
               o_begin = o_item + total, o_start = o_begin + n_items + 1,
               o_tbegin = o_start + il * n_kv, o_tcount = o_tbegin + il, o_tables = o_tcount + il,
               n_ints = o_tables + n_tables;
  host_meta_.resize(n_ints);
  int32_t* m = host_meta_.data();
  int off = 0, max_new = 0, max_len = 0;
  size_t t_off = 0;
  bool any_probs = false;
  host_probs_strides_.assign(static_cast<size_t>(n_items), 0);
  on_backend_.assign(static_cast<size_t>(n_items), 0);
  for (int i = 0; i < n_items; ++i) {
    const BatchItem& item = batch[static_cast<size_t>(i)];
    const int32_t p0 = item.cache->next_position();
    m[o_begin + i] = off;
    for (int j = 0; j < item.n; ++j) {
      m[o_tokens + off + j] = item.tokens[j];
      m[o_pos + off + j] = p0 + j;
      m[o_item + off + j] = i;
      host_positions_[off + j] = p0 + j;
    }
    off += item.n;
    max_new = std::max(max_new, item.n);
    const kernels::PagedKv view = item.cache->View();
    int item_len = 0;
    for (int l = 0; l < n_layers; ++l) {
      const size_t idx = static_cast<size_t>(i) * n_layers + l;
      const int32_t* lens = item.cache->lengths(l);
      for (int h = 0; h < n_kv; ++h) {
        m[o_start + idx * n_kv + h] = lens[h];
        item_len = std::max(item_len, lens[h] + item.n);
      }
      m[o_tbegin + idx] = static_cast<int32_t>(t_off);
      m[o_tcount + idx] = view.block_counts[l];
      std::copy_n(view.block_tables[l], view.block_counts[l], m + o_tables + t_off);
      t_off += static_cast<size_t>(view.block_counts[l]);
    }
    max_len = std::max(max_len, item_len);
    if (item.attn_probs != nullptr) {
      host_probs_strides_[static_cast<size_t>(i)] = item.probs_stride;
    } else if (item.probs_on_backend) {
      host_probs_strides_[static_cast<size_t>(i)] = (item_len + 15) / 16 * 16;
      on_backend_[static_cast<size_t>(i)] = 1;
    }
    any_probs |= item.attn_probs != nullptr || item.probs_on_backend;
  }
  m[o_begin + n_items] = off;

  // Probability destinations: the items' own host rows when the backend writes host memory,
  // else a scratch in backend memory (copied out after the step unless probs_on_backend).
  host_probs_.assign(static_cast<size_t>(n_items), nullptr);
  if (any_probs) {
    const int64_t rows = static_cast<int64_t>(n_layers) * c.n_heads;
    const auto in_scratch = [&](int i) {
      return on_backend_[static_cast<size_t>(i)] != 0 ||
             (batch[static_cast<size_t>(i)].attn_probs != nullptr && !memory_.host_accessible());
    };
    int64_t scratch_floats = 0;
    for (int i = 0; i < n_items; ++i) {
      if (in_scratch(i)) scratch_floats += rows * host_probs_strides_[static_cast<size_t>(i)];
    }
    if (scratch_floats > 0) {
      RECALL_RETURN_IF_ERROR(
          Ensure(probs_, static_cast<size_t>(scratch_floats) * sizeof(float), 1.5));
    }
    int64_t p_off = 0;
    for (int i = 0; i < n_items; ++i) {
      if (in_scratch(i)) {
        host_probs_[static_cast<size_t>(i)] = F(probs_) + p_off;
        p_off += rows * host_probs_strides_[static_cast<size_t>(i)];
      } else {
        host_probs_[static_cast<size_t>(i)] = batch[static_cast<size_t>(i)].attn_probs;
      }
    }
  }

  // One copy to backend memory (none for host memory).
  const int32_t* dm = m;
  kv_.probs = nullptr;
  kv_.probs_stride = nullptr;
  if (!memory_.host_accessible()) {
    RECALL_RETURN_IF_ERROR(Ensure(meta_, n_ints * sizeof(int32_t), 2.0));
    memory_.CopyIn(meta_.get(), m, n_ints * sizeof(int32_t));
    dm = meta_.as<int32_t>();
    if (any_probs) {
      RECALL_RETURN_IF_ERROR(Ensure(probs_ptrs_, n_items * sizeof(float*)));
      RECALL_RETURN_IF_ERROR(Ensure(probs_strides_, n_items * sizeof(int64_t)));
      memory_.CopyIn(probs_ptrs_.get(), host_probs_.data(), n_items * sizeof(float*));
      memory_.CopyIn(probs_strides_.get(), host_probs_strides_.data(), n_items * sizeof(int64_t));
      kv_.probs = probs_ptrs_.as<float*>();
      kv_.probs_stride = probs_strides_.as<int64_t>();
    }
  } else if (any_probs) {
    kv_.probs = host_probs_.data();
    kv_.probs_stride = host_probs_strides_.data();
  }
  tokens_ = dm + o_tokens;
  positions_ = dm + o_pos;
  const kernels::PagedKv first = batch[0].cache->View();
  kv_.layout = first.layout;
  kv_.pool = first.pool;
  kv_.n_items = n_items;
  kv_.total_tokens = total;
  kv_.max_new_tokens = max_new;
  kv_.max_kv_len = recordable ? StepGraphs::BucketLength(max_len) : max_len;
  kv_.token_begin = dm + o_begin;
  kv_.token_item = dm + o_item;
  kv_.kv_start = dm + o_start;
  kv_.table_begin = dm + o_tbegin;
  kv_.table_count = dm + o_tcount;
  kv_.tables = dm + o_tables;
  kv_.host_token_begin = m + o_begin;
  kv_.host_kv_start = m + o_start;
  kv_.host_table_begin = m + o_tbegin;
  kv_.host_table_count = m + o_tcount;
  kv_.host_tables = m + o_tables;
  kv_.host_probs = any_probs ? host_probs_.data() : nullptr;
  kv_.host_probs_stride = host_probs_strides_.data();
  return absl::OkStatus();
}

absl::Status ForwardPass::Run(std::span<const BatchItem> batch, float* logits) {
  RECALL_RETURN_IF_ERROR(workspace_status_);
  const model::ModelConfig& c = model_.config;
  // ---- Validate the whole batch before touching any cache.
  int total = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const BatchItem& item = batch[i];
    if (item.cache == nullptr || item.n <= 0 || item.tokens == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("batch item ", i, ": needs a cache and at least one token"));
    }
    if ((item.attn_probs != nullptr || item.probs_on_backend) && item.n != 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("batch item ", i, ": attention probabilities need a decode step (n = 1)"));
    }
    if (item.pick != nullptr && item.sampling != nullptr &&
        !kernels::SamplesOnBackend(*item.sampling)) {
      return absl::InvalidArgumentError(
          absl::StrCat("batch item ", i,
                       ": pick: a repetition penalty needs the sequence's history; sample "
                       "its logits on the host (Backend::Sample)"));
    }
    if (item.attn_probs != nullptr && item.probs_on_backend) {
      return absl::InvalidArgumentError(
          absl::StrCat("batch item ", i, ": attn_probs and probs_on_backend are exclusive"));
    }
    if (item.cache->View().pool != batch[0].cache->View().pool) {
      return absl::InvalidArgumentError(
          absl::StrCat("batch item ", i, ": every sequence of a batch must use the same pool"));
    }
    for (int j = 0; j < item.n; ++j) {
      if (item.tokens[j] < 0 || item.tokens[j] >= c.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat(
            "batch item ", i, ": token id ", item.tokens[j], " outside [0, ", c.vocab_size, ")"));
      }
    }
    if (item.cache->next_position() + item.n > c.max_seq_len) {
      return absl::InvalidArgumentError(
          absl::StrCat("batch item ", i, ": position ", item.cache->next_position() + item.n,
                       " exceeds the model's context length ", c.max_seq_len));
    }
    total += item.n;
  }
  if (total > options_.max_batch_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "batch of ", total, " tokens exceeds max_batch_tokens ", options_.max_batch_tokens));
  }
  if (batch.empty()) return absl::OkStatus();
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
  // Staged before the vote: a rank that cannot stage (device scratch) says so in the vote
  // instead of leaving its peers in the pass's collectives, which NCCL does not time out.
  const bool recordable = Recordable(batch);
  if (reserved.ok()) reserved = StageBatch(batch, total, recordable);
  if (options_.comm != nullptr) {
    int32_t all_ok = reserved.ok() ? 1 : 0;
    kernels::Communicator& votes =
        options_.host_comm != nullptr ? *options_.host_comm : *options_.comm;
    absl::Status st = votes.AllReduce(&all_ok, 1, kernels::ReduceOp::kMin);
    if (!st.ok()) {
      give_back();
      return st;
    }
    if (all_ok == 0 && reserved.ok()) {
      reserved = absl::ResourceExhaustedError(
          "another tensor-parallel rank cannot hold the batch (its KV block pool or device "
          "scratch)");
    }
  }
  if (!reserved.ok()) {
    give_back();
    return reserved;
  }
  absl::Status ran;
  if (recordable) {
    const StepKey key{kv_.n_items,      kv_.max_kv_len,          tokens_,
                      kv_.pool,         kv_.layout.dtype,        kv_.layout.block_tokens,
                      kv_.probs,        kv_.probs_stride};
    ran = graphs_.Run(
        key, [&] { return RunLayers(batch, total); }, x_.get(),
        static_cast<size_t>(total) * c.dim * sizeof(float));
  } else {
    ran = RunLayers(batch, total);
  }
  if (!ran.ok()) {
    give_back();
    return ran;
  }

  // ---- Commit the appended tokens to every cache.
  int off = 0;
  for (const BatchItem& item : batch) {
    item.cache->CommitAppend(host_positions_.data() + off, item.n);
    off += item.n;
  }

  // ---- Logits of the last token of each item that wants them. Their rows are gathered in
  // runs of consecutive rows: one copy for a batch of decode steps.
  const int dim = c.dim;
  const float* x = F(x_);
  int n_out = 0;
  off = 0;
  float* last = F(last_);
  int run_src = 0, run_dst = 0, run_len = 0;
  const auto gather = [&] {
    if (run_len == 0) return;
    memory_.Copy(last + static_cast<size_t>(run_dst) * dim, x + static_cast<size_t>(run_src) * dim,
                 static_cast<size_t>(run_len) * dim * sizeof(float));
  };
  for (const BatchItem& item : batch) {
    off += item.n;
    if (!item.want_logits) continue;
    if (run_len > 0 && off - 1 == run_src + run_len) {
      ++run_len;
    } else {
      gather();
      run_src = off - 1;
      run_dst = n_out;
      run_len = 1;
    }
    ++n_out;
  }
  gather();
  if (n_out > 0 && logits != nullptr) {
    RECALL_RETURN_IF_ERROR(ComputeLogits(batch, n_out, logits));
  }
  // ---- Attention probabilities staged in device memory go to the items' host rows.
  if (!memory_.host_accessible() && kv_.probs != nullptr) {
    const size_t rows = static_cast<size_t>(c.n_layers) * c.n_heads;
    for (size_t i = 0; i < batch.size(); ++i) {
      const BatchItem& item = batch[i];
      if (item.attn_probs == nullptr) continue;
      const size_t stride = static_cast<size_t>(item.probs_stride) * sizeof(float);
      const size_t width =
          std::min<size_t>(item.probs_stride, item.cache->max_length()) * sizeof(float);
      memory_.CopyOutRows(item.attn_probs, stride, host_probs_[i], stride, width, rows);
    }
  }
  // A GPU backend's failed op (void, asynchronous) surfaces here.
  return backend_.Health();
}

bool ForwardPass::Recordable(std::span<const BatchItem> batch) const {
  if (!options_.step_graphs || !graphs_.enabled() || options_.comm != nullptr ||
      !backend_.CanRecord()) {
    return false;
  }
  for (const BatchItem& item : batch) {
    if (item.n != 1 || item.window_queries != nullptr) return false;
    if (item.hidden_sum != nullptr && item.hidden_layer >= 0 &&
        item.hidden_layer < model_.config.n_layers) {
      return false;
    }
  }
  return true;
}

absl::Status ForwardPass::RunLayers(std::span<const BatchItem> batch, int total) {
  const model::ModelConfig& c = model_.config;
  const int dim = c.dim, hd = c.head_dim;
  const int q_dim = c.n_heads * hd, kv_dim = c.n_kv_heads * hd;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  float* x = F(x_);
  float *xb = F(xb_), *q = F(q_), *k = F(k_), *v = F(v_), *att = F(att_), *hb = F(hb_),
        *hb2 = F(hb2_);
  backend_.Embedding(model_.tok_embeddings, tokens_, total, x);
  // Each residual add is fused with the RMSNorm that follows it (the next layer's attention
  // norm, then this layer's FFN norm): xb holds the normed x at the top of every layer.
  backend_.RmsNorm(x, model_.layers[0].attn_norm.f32(), total, dim, c.norm_eps, xb);

  for (int l = 0; l < c.n_layers; ++l) {
    const model::LayerWeights& w = model_.layers[l];
    MatMulMany(xb, total, {w.wq, w.wk, w.wv}, {q, k, v});
    if (c.qkv_bias) {
      backend_.AddBias(q, w.bq.f32(), total, q_dim);
      backend_.AddBias(k, w.bk.f32(), total, kv_dim);
      backend_.AddBias(v, w.bv.f32(), total, kv_dim);
    }
    if (c.qk_norm) {
      backend_.RmsNorm(q, w.q_norm.f32(), total * c.n_heads, hd, c.norm_eps, q);
      backend_.RmsNorm(k, w.k_norm.f32(), total * c.n_kv_heads, hd, c.norm_eps, k);
    }
    backend_.Rope(q, positions_, total, c.n_heads, hd, c.rope_theta, c.rope_style);
    backend_.Rope(k, positions_, total, c.n_kv_heads, hd, c.rope_theta, c.rope_style);
    CaptureWindowQueries(batch, l);

    backend_.StoreKvBatch(kv_, l, k, v);
    backend_.AttentionBatch(kv_, l, q, c.n_heads, scale, att);

    MatMul(att, total, w.wo, xb);
    RECALL_RETURN_IF_ERROR(AddReduced(xb, x, total, w.ffn_norm.f32(), xb));
    MatMulMany(xb, total, {w.w_gate, w.w_up}, {hb, hb2});
    backend_.SiluMul(hb, hb2, static_cast<int64_t>(total) * c.hidden_dim, hb);
    MatMul(hb, total, w.w_down, xb);
    const float* next_norm =
        l + 1 < c.n_layers ? model_.layers[static_cast<size_t>(l) + 1].attn_norm.f32() : nullptr;
    RECALL_RETURN_IF_ERROR(AddReduced(xb, x, total, next_norm, xb));
    CaptureHidden(batch, l);
  }

  return absl::OkStatus();
}

absl::Status ForwardPass::ComputeLogits(std::span<const BatchItem> batch, int n_out,
                                        float* logits) {
  const model::ModelConfig& c = model_.config;
  const size_t vocab = static_cast<size_t>(c.vocab_size);
  float* last = F(last_);
  backend_.RmsNorm(last, model_.final_norm.f32(), n_out, c.dim, c.norm_eps, last);
  float* out = logits;
  if (!memory_.host_accessible()) {
    RECALL_RETURN_IF_ERROR(Ensure(logits_, n_out * vocab * sizeof(float)));
    out = F(logits_);
  }
  MatMul(last, n_out, model_.lm_head, out);
  // Picks: every row gets one (the rows without are greedy, ignored), in one launch.
  pick_params_.assign(static_cast<size_t>(n_out), kernels::SamplingParams{.temperature = 0});
  pick_draws_.assign(static_cast<size_t>(n_out), 0.0f);
  bool any_pick = false;
  int row = 0;
  for (const BatchItem& item : batch) {
    if (!item.want_logits) continue;
    if (item.pick != nullptr) {
      any_pick = true;
      if (item.sampling != nullptr) pick_params_[static_cast<size_t>(row)] = *item.sampling;
      pick_draws_[static_cast<size_t>(row)] = item.draw;
    }
    ++row;
  }
  if (any_pick) {
    RECALL_RETURN_IF_ERROR(Ensure(picks_, n_out * sizeof(int32_t)));
    backend_.SampleRows(out, n_out, c.vocab_size, pick_params_.data(), pick_draws_.data(),
                        picks_.as<int32_t>());
    host_picks_.resize(static_cast<size_t>(n_out));
    memory_.CopyOut(host_picks_.data(), picks_.get(), n_out * sizeof(int32_t));
  }
  // Rows to the host: the items without a pick, in runs of consecutive rows.
  int run_begin = -1;
  row = 0;
  const auto flush = [&](int end) {
    if (run_begin < 0 || out == logits) return;
    memory_.CopyOut(logits + run_begin * vocab, out + run_begin * vocab,
                    (end - run_begin) * vocab * sizeof(float));
  };
  for (const BatchItem& item : batch) {
    if (!item.want_logits) continue;
    if (item.pick != nullptr) {
      *item.pick = host_picks_[static_cast<size_t>(row)];
      flush(row);
      run_begin = -1;
    } else if (run_begin < 0) {
      run_begin = row;
    }
    ++row;
  }
  flush(row);
  return absl::OkStatus();
}

const float* ForwardPass::backend_probs(size_t item, int64_t* stride) const {
  if (item >= on_backend_.size() || on_backend_[item] == 0) return nullptr;
  *stride = host_probs_strides_[item];
  return host_probs_[item];
}

absl::Status RunChunked(ForwardPass& forward, cache::SequenceCache* cache,
                        std::span<const int32_t> tokens, int chunk, float* logits,
                        float* window_queries, int window_w) {
  if (chunk < 1) return absl::InvalidArgumentError(absl::StrCat("chunk: ", chunk, " must be >= 1"));
  const int n = static_cast<int>(tokens.size());
  const int window_first = cache->next_position() + n - window_w;
  for (int start = 0; start < n; start += chunk) {
    BatchItem item;
    item.cache = cache;
    item.tokens = tokens.data() + start;
    item.n = std::min(chunk, n - start);
    item.want_logits = logits != nullptr && start + item.n == n;
    if (window_queries != nullptr) {
      item.window_queries = window_queries;
      item.window_w = window_w;
      item.window_first = window_first;
    }
    RECALL_RETURN_IF_ERROR(forward.Run({&item, 1}, item.want_logits ? logits : nullptr));
  }
  return absl::OkStatus();
}

}  // namespace recall::runtime
