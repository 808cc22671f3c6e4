// llama2.c checkpoint loader (run.c format): a 7-int32 header, then fp32 weights. The file is
// mapped read-only and every Matrix is a view into the mapping (zero copy).
// Every header field is range-checked, and the file must be exactly as long as the header
// implies: run.c trusts the header, so a wrong vocab_size there reads past a short file or
// misplaces every weight of a long one (and then the tokenizer, sized by it, too).
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status.h"
#include "worker/model/file_storage.h"
#include "worker/model/finite.h"
#include "worker/model/loader.h"

namespace recall::model {
namespace {

constexpr int kHeaderInts = 7;
constexpr uint64_t kHeaderBytes = kHeaderInts * sizeof(int32_t);

struct Header {
  int32_t dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len;
};

absl::Status HeaderFieldError(const std::string& path, const char* field, int64_t value,
                              const std::string& limit) {
  return absl::InvalidArgumentError(
      absl::StrCat(path, ": header field ", field, " = ", value, " is invalid: ", limit));
}

absl::Status CheckField(const std::string& path, const char* field, int64_t value, int64_t max) {
  if (value < 1 || value > max) {
    return HeaderFieldError(path, field, value, absl::StrCat("must be in [1, ", max, "]"));
  }
  return absl::OkStatus();
}

// Range and divisibility checks on the raw header; all later size math fits in uint64.
absl::Status CheckHeader(const std::string& path, const Header& h) {
  RECALL_RETURN_IF_ERROR(CheckField(path, "dim", h.dim, 1 << 16));
  RECALL_RETURN_IF_ERROR(CheckField(path, "hidden_dim", h.hidden_dim, 1 << 20));
  RECALL_RETURN_IF_ERROR(CheckField(path, "n_layers", h.n_layers, 1024));
  RECALL_RETURN_IF_ERROR(CheckField(path, "n_heads", h.n_heads, h.dim));
  if (h.dim % h.n_heads != 0) {
    return HeaderFieldError(path, "n_heads", h.n_heads, absl::StrCat("must divide dim = ", h.dim));
  }
  RECALL_RETURN_IF_ERROR(CheckField(path, "n_kv_heads", h.n_kv_heads, h.n_heads));
  if (h.n_heads % h.n_kv_heads != 0) {
    return HeaderFieldError(path, "n_kv_heads", h.n_kv_heads,
                            absl::StrCat("must divide n_heads = ", h.n_heads));
  }
  if ((h.dim / h.n_heads) % 2 != 0) {
    return HeaderFieldError(
        path, "n_heads", h.n_heads,
        absl::StrCat("head size dim / n_heads = ", h.dim / h.n_heads, " must be even"));
  }
  // int64 so that INT32_MIN has an absolute value.
  const int64_t vocab = std::llabs(static_cast<int64_t>(h.vocab_size));
  if (vocab < 1 || vocab > (1 << 24)) {
    return HeaderFieldError(path, "vocab_size", h.vocab_size,
                            absl::StrCat("|vocab_size| must be in [1, ", 1 << 24, "]"));
  }
  RECALL_RETURN_IF_ERROR(CheckField(path, "seq_len", h.seq_len, 1 << 24));
  return absl::OkStatus();
}

// Hands out consecutive fp32 matrices from the mapped file.
class Cursor {
 public:
  explicit Cursor(const char* base) : base_(base) {}
  kernels::Matrix Take(int64_t rows, int64_t cols) {
    kernels::Matrix m;
    m.data = base_ + offset_;
    m.dtype = kernels::DType::kF32;
    m.rows = rows;
    m.cols = cols;
    offset_ += static_cast<uint64_t>(rows) * static_cast<uint64_t>(cols) * sizeof(float);
    return m;
  }
  void Skip(uint64_t floats) { offset_ += floats * sizeof(float); }
  uint64_t offset() const { return offset_; }

 private:
  const char* base_;
  uint64_t offset_ = kHeaderBytes;
};

// The vocab_size (sign: tied or not) whose llama2.c layout is exactly `file_size` bytes
// when every other field is as in the header, or 0 when none is.
int64_t FittingVocab(uint64_t file_size, uint64_t dim, uint64_t other_floats, bool tied) {
  if (file_size < kHeaderBytes || (file_size - kHeaderBytes) % sizeof(float) != 0) return 0;
  const uint64_t floats = (file_size - kHeaderBytes) / sizeof(float);
  const uint64_t per_token = (tied ? 1 : 2) * dim;
  if (floats <= other_floats || (floats - other_floats) % per_token != 0) return 0;
  const uint64_t vocab = (floats - other_floats) / per_token;
  if (vocab > (1 << 24)) return 0;
  return tied ? static_cast<int64_t>(vocab) : -static_cast<int64_t>(vocab);
}

// The file is not the size its header implies: truncated (DataLoss), or longer, which run.c
// would accept but which means a header field is wrong (reading on would misplace every
// weight after it). Names vocab_size when another vocab_size would fit the file exactly.
absl::Status SizeMismatch(const std::string& path, const Header& h, uint64_t file_size,
                          uint64_t expected, uint64_t other_floats) {
  const std::string implied = absl::StrCat(
      "the header (dim ", h.dim, ", hidden_dim ", h.hidden_dim, ", n_layers ", h.n_layers,
      ", n_heads ", h.n_heads, ", n_kv_heads ", h.n_kv_heads, ", vocab_size ", h.vocab_size,
      ", seq_len ", h.seq_len, ") implies ", expected, " bytes, file has ", file_size, " bytes");
  std::vector<std::string> fits;
  for (bool tied : {true, false}) {
    if (const int64_t v = FittingVocab(file_size, h.dim, other_floats, tied); v != 0) {
      fits.push_back(absl::StrCat(v, tied ? " (tied)" : " (untied)"));
    }
  }
  const std::string hint =
      fits.empty() ? ""
                   : absl::StrCat("; header field vocab_size = ", h.vocab_size,
                                  " is likely wrong: vocab_size = ", absl::StrJoin(fits, " or "),
                                  " fits the file exactly");
  if (file_size < expected) {
    return absl::DataLossError(
        absl::StrCat(path, ": truncated llama2.c checkpoint: ", implied, hint));
  }
  return absl::DataLossError(absl::StrCat(path, ": llama2.c checkpoint is ", file_size - expected,
                                          " bytes longer than its header allows: ", implied, hint));
}

// Every weight is finite (finite.h), named as run.c's TransformerWeights fields.
absl::Status CheckWeightsFinite(const std::string& path, const Model& m) {
  const auto check = [&](const char* field, int64_t layer, const kernels::Matrix& w) {
    const std::string name = layer < 0 ? field : absl::StrCat(field, " of layer ", layer);
    return CheckFinite(path, name, w.data, w.dtype, w.rows, w.cols);
  };
  RECALL_RETURN_IF_ERROR(check("token_embedding_table", -1, m.tok_embeddings));
  for (size_t l = 0; l < m.layers.size(); ++l) {
    const LayerWeights& w = m.layers[l];
    const auto i = static_cast<int64_t>(l);
    RECALL_RETURN_IF_ERROR(check("rms_att_weight", i, w.attn_norm));
    RECALL_RETURN_IF_ERROR(check("wq", i, w.wq));
    RECALL_RETURN_IF_ERROR(check("wk", i, w.wk));
    RECALL_RETURN_IF_ERROR(check("wv", i, w.wv));
    RECALL_RETURN_IF_ERROR(check("wo", i, w.wo));
    RECALL_RETURN_IF_ERROR(check("rms_ffn_weight", i, w.ffn_norm));
    RECALL_RETURN_IF_ERROR(check("w1", i, w.w_gate));
    RECALL_RETURN_IF_ERROR(check("w2", i, w.w_down));
    RECALL_RETURN_IF_ERROR(check("w3", i, w.w_up));
  }
  RECALL_RETURN_IF_ERROR(check("rms_final_weight", -1, m.final_norm));
  if (!m.config.tied_embeddings) RECALL_RETURN_IF_ERROR(check("wcls", -1, m.lm_head));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> LoadLlama2c(const std::string& path) {
  RECALL_ASSIGN_OR_RETURN(std::unique_ptr<Storage> file, MapFile(path));
  const uint64_t file_size = file->size();
  if (file_size < kHeaderBytes) {
    return absl::DataLossError(absl::StrCat(path, ": truncated llama2.c checkpoint: expected a ",
                                            kHeaderBytes, "-byte header, file has ", file_size,
                                            " bytes"));
  }
  Header h;
  std::memcpy(&h, file->data(), sizeof(h));
  RECALL_RETURN_IF_ERROR(CheckHeader(path, h));

  const bool tied = h.vocab_size > 0;
  const uint64_t vocab = static_cast<uint64_t>(std::llabs(static_cast<int64_t>(h.vocab_size)));
  const uint64_t dim = h.dim, hidden = h.hidden_dim, layers = h.n_layers;
  const uint64_t head_dim = dim / h.n_heads;
  const uint64_t kv_dim = static_cast<uint64_t>(h.n_kv_heads) * head_dim;
  const uint64_t per_layer = 2 * dim + 2 * dim * dim + 2 * kv_dim * dim + 3 * hidden * dim;
  const uint64_t freq = static_cast<uint64_t>(h.seq_len) * head_dim / 2;
  const uint64_t floats =
      vocab * dim + layers * per_layer + dim + 2 * freq + (tied ? 0 : vocab * dim);
  const uint64_t expected = kHeaderBytes + floats * sizeof(float);
  if (file_size != expected) {
    return SizeMismatch(path, h, file_size, expected, floats - (tied ? 1 : 2) * vocab * dim);
  }

  auto model = std::make_unique<Model>();
  ModelConfig& c = model->config;
  c.arch = Arch::kLlama;
  c.dim = h.dim;
  c.hidden_dim = h.hidden_dim;
  c.n_layers = h.n_layers;
  c.n_heads = h.n_heads;
  c.n_kv_heads = h.n_kv_heads;
  c.head_dim = static_cast<int>(head_dim);
  c.vocab_size = static_cast<int>(vocab);
  c.max_seq_len = h.seq_len;
  c.rope_theta = 10000.0f;
  c.norm_eps = 1e-5f;
  c.rope_style = kernels::RopeStyle::kInterleaved;
  c.tied_embeddings = tied;
  c.weight_dtype = kernels::DType::kF32;
  c.bos_token_id = vocab > 1 ? 1 : -1;  // as the llama2.c tokenizer's ids
  c.eos_token_id = vocab > 2 ? 2 : -1;
  RECALL_RETURN_IF_ERROR(Annotate(c.Validate(), path));

  // llama2.c stores each weight kind for all layers together.
  Cursor cur(static_cast<const char*>(file->data()));
  const int64_t L = h.n_layers, D = h.dim, H = h.hidden_dim, KV = static_cast<int64_t>(kv_dim);
  model->layers.resize(L);
  model->tok_embeddings = cur.Take(static_cast<int64_t>(vocab), D);
  for (int64_t l = 0; l < L; ++l) model->layers[l].attn_norm = cur.Take(1, D);
  for (int64_t l = 0; l < L; ++l) model->layers[l].wq = cur.Take(D, D);
  for (int64_t l = 0; l < L; ++l) model->layers[l].wk = cur.Take(KV, D);
  for (int64_t l = 0; l < L; ++l) model->layers[l].wv = cur.Take(KV, D);
  for (int64_t l = 0; l < L; ++l) model->layers[l].wo = cur.Take(D, D);
  for (int64_t l = 0; l < L; ++l) model->layers[l].ffn_norm = cur.Take(1, D);
  for (int64_t l = 0; l < L; ++l) model->layers[l].w_gate = cur.Take(H, D);  // w1
  for (int64_t l = 0; l < L; ++l) model->layers[l].w_down = cur.Take(D, H);  // w2
  for (int64_t l = 0; l < L; ++l) model->layers[l].w_up = cur.Take(H, D);    // w3
  model->final_norm = cur.Take(1, D);
  cur.Skip(2 * freq);  // freq_cis_real, freq_cis_imag (unused: RoPE is computed)
  model->lm_head = tied ? model->tok_embeddings : cur.Take(static_cast<int64_t>(vocab), D);
  if (cur.offset() != expected) {
    return absl::InternalError(absl::StrCat(path, ": llama2.c layout mismatch: consumed ",
                                            cur.offset(), " bytes, expected ", expected));
  }
  RECALL_RETURN_IF_ERROR(CheckWeightsFinite(path, *model));
  model->source = path;
  model->storage.push_back(std::move(file));
  return model;
}

}  // namespace recall::model
