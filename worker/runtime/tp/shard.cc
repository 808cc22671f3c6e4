#include "worker/runtime/tp/shard.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/flags.h"
#include "common/status.h"
#include "worker/model/file_storage.h"

namespace recall::runtime::tp {
namespace {

using kernels::Matrix;

// Rows [begin, begin + n) of m, as a view.
Matrix RowSlice(const Matrix& m, int64_t begin, int64_t n) {
  if (m.empty()) return m;
  Matrix out = m;
  out.data = static_cast<const uint8_t*>(m.data) + begin * m.cols * kernels::DTypeSize(m.dtype);
  out.rows = n;
  if (m.dtype == kernels::DType::kI8) {  // the rows' scales and sums go with them
    out.scales = m.scales + begin;
    out.row_sums = m.row_sums + begin;
  }
  if (m.dtype == kernels::DType::kF8E4M3) out.scales = m.scales + begin * m.ScaleColumns();
  return out;
}

// Entries [begin, begin + n) of a [1, cols] vector (a bias), as a view.
Matrix VectorSlice(const Matrix& m, int64_t begin, int64_t n) {
  if (m.empty()) return m;
  Matrix out = m;
  out.data = static_cast<const uint8_t*>(m.data) + begin * kernels::DTypeSize(m.dtype);
  out.cols = n;
  return out;
}

// Columns [begin, begin + n) of m, copied into new storage owned by `model`. Int8 rows keep
// their scales (the slice holds the same integers as the full row) and get the sums of their
// slice. FP8 rows keep the scales of the blocks the slice covers, so the slice must start on
// a block (InvalidArgument naming tp otherwise), unless a row has a single scale.
absl::StatusOr<Matrix> ColumnSlice(const Matrix& m, int64_t begin, int64_t n, model::Model* model) {
  const size_t esize = kernels::DTypeSize(m.dtype);
  const bool int8 = m.dtype == kernels::DType::kI8;
  const bool fp8 = m.dtype == kernels::DType::kF8E4M3;
  const bool one_scale = fp8 && m.ScaleColumns() == 1;
  if (fp8 && !one_scale && begin % m.scale_block != 0) {
    return flags::FieldError(
        "tp", absl::StrCat("a rank's columns of an FP8 weight [", m.rows, ", ", m.cols,
                           "] start at column ", begin, ", inside a block of ", m.scale_block,
                           " columns that share one scale; pick a tp whose shards start on a "
                           "block, or load the weights with weight_dtype auto or int8"));
  }
  Matrix out{nullptr, m.dtype, m.rows, n};
  if (fp8) out.scale_block = one_scale ? static_cast<int32_t>((n + 7) / 8 * 8) : m.scale_block;
  const size_t bytes = static_cast<size_t>(m.rows * n) * esize;
  const size_t sums_at = (bytes + 63) / 64 * 64;
  const size_t extra = int8 ? static_cast<size_t>(m.rows) * 4 : fp8 ? out.scale_bytes() : 0;
  RECALL_ASSIGN_OR_RETURN(std::unique_ptr<model::HeapStorage> storage,
                          model::HeapStorage::Create(extra > 0 ? sums_at + extra : bytes));
  uint8_t* dst = static_cast<uint8_t*>(storage->MutableData());
  const uint8_t* src = static_cast<const uint8_t*>(m.data);
  for (int64_t r = 0; r < m.rows; ++r) {
    std::memcpy(dst + r * n * esize, src + (r * m.cols + begin) * esize, n * esize);
  }
  out.data = storage->data();
  if (fp8) {
    auto* scales = reinterpret_cast<float*>(dst + sums_at);
    const int64_t per_row = out.ScaleColumns(), first = one_scale ? 0 : begin / m.scale_block;
    for (int64_t r = 0; r < m.rows; ++r) {
      std::memcpy(scales + r * per_row, m.scales + r * m.ScaleColumns() + first,
                  static_cast<size_t>(per_row) * sizeof(float));
    }
    out.scales = scales;
  }
  if (int8) {
    auto* sums = reinterpret_cast<int32_t*>(dst + sums_at);
    for (int64_t r = 0; r < m.rows; ++r) {
      int32_t sum = 0;
      for (int64_t c = 0; c < n; ++c) sum += reinterpret_cast<const int8_t*>(dst)[r * n + c];
      sums[r] = sum;
    }
    out.scales = m.scales;
    out.row_sums = sums;
  }
  model->storage.push_back(std::move(storage));
  return out;
}

}  // namespace

absl::StatusOr<TpLayout> MakeTpLayout(const model::ModelConfig& c, int tp, int rank) {
  if (tp < 1) return flags::FieldError("tp", absl::StrCat(tp, " must be >= 1"));
  if (rank < 0 || rank >= tp) {
    return absl::InvalidArgumentError(absl::StrCat("tp rank: ", rank, " outside [0, ", tp, ")"));
  }
  if (c.n_heads % tp != 0) {
    return flags::FieldError(
        "tp", absl::StrCat(tp, " does not divide the model's ", c.n_heads, " query heads"));
  }
  if (c.hidden_dim % tp != 0) {
    return flags::FieldError("tp", absl::StrCat(tp, " does not divide the model's ",
                                                "MLP width hidden_dim = ", c.hidden_dim));
  }
  if (c.n_kv_heads % tp != 0 && tp % c.n_kv_heads != 0) {
    return flags::FieldError(
        "tp", absl::StrCat(tp, " must divide the model's ", c.n_kv_heads,
                           " KV heads or be a multiple of them (KV heads are then replicated)"));
  }
  TpLayout l;
  l.tp = tp;
  l.rank = rank;
  l.q_heads = c.n_heads / tp;
  l.q_head_offset = rank * l.q_heads;
  if (c.n_kv_heads % tp == 0) {
    l.kv_heads = c.n_kv_heads / tp;
    l.kv_head_offset = rank * l.kv_heads;
  } else {
    l.kv_heads = 1;
    l.kv_head_offset = l.q_head_offset / (c.n_heads / c.n_kv_heads);
  }
  l.hidden = c.hidden_dim / tp;
  l.hidden_offset = rank * l.hidden;
  return l;
}

absl::StatusOr<std::unique_ptr<model::Model>> ShardModel(const model::Model& full, int tp,
                                                         int rank) {
  RECALL_ASSIGN_OR_RETURN(TpLayout l, MakeTpLayout(full.config, tp, rank));
  const int hd = full.config.head_dim;
  auto out = std::make_unique<model::Model>();
  out->config = full.config;
  out->config.n_heads = l.q_heads;
  out->config.n_kv_heads = l.kv_heads;
  out->config.hidden_dim = l.hidden;
  out->tok_embeddings = full.tok_embeddings;
  out->final_norm = full.final_norm;
  out->lm_head = full.lm_head;
  out->source = absl::StrCat(full.source, " [tp rank ", rank, " of ", tp, "]");
  const int64_t q0 = static_cast<int64_t>(l.q_head_offset) * hd, qn = int64_t{l.q_heads} * hd;
  const int64_t k0 = static_cast<int64_t>(l.kv_head_offset) * hd, kn = int64_t{l.kv_heads} * hd;
  for (const model::LayerWeights& w : full.layers) {
    model::LayerWeights s = w;  // norms (and q/k norms) replicated
    s.wq = RowSlice(w.wq, q0, qn);
    s.wk = RowSlice(w.wk, k0, kn);
    s.wv = RowSlice(w.wv, k0, kn);
    s.bq = VectorSlice(w.bq, q0, qn);
    s.bk = VectorSlice(w.bk, k0, kn);
    s.bv = VectorSlice(w.bv, k0, kn);
    RECALL_ASSIGN_OR_RETURN(s.wo, ColumnSlice(w.wo, q0, qn, out.get()));
    s.w_gate = RowSlice(w.w_gate, l.hidden_offset, l.hidden);
    s.w_up = RowSlice(w.w_up, l.hidden_offset, l.hidden);
    RECALL_ASSIGN_OR_RETURN(s.w_down, ColumnSlice(w.w_down, l.hidden_offset, l.hidden, out.get()));
    out->layers.push_back(s);
  }
  RECALL_RETURN_IF_ERROR(out->config.Validate());
  return out;
}

}  // namespace recall::runtime::tp
