// MakeRandomModel: deterministic random weights of a given shape (for benchmarks and tests).
#include "worker/model/random_model.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/model/file_storage.h"
#include "worker/model/half.h"

namespace recall::model {
namespace {

// SplitMix64: tiny, fast and good enough for weights.
class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  // Uniform in [-1, 1).
  float Symmetric() { return static_cast<float>(Next() >> 40) * (2.0f / 16777216.0f) - 1.0f; }

 private:
  uint64_t state_;
};

class Filler {
 public:
  Filler(Model* model, uint64_t seed) : model_(model), rng_(seed) {}

  // Uniform in +-1/sqrt(cols), stored in `dtype`.
  absl::StatusOr<kernels::Matrix> Random(int64_t rows, int64_t cols, kernels::DType dtype) {
    const int64_t n = rows * cols;
    RECALL_ASSIGN_OR_RETURN(
        std::unique_ptr<HeapStorage> s,
        HeapStorage::Create(static_cast<size_t>(n) * kernels::DTypeSize(dtype)));
    const float scale = 1.0f / std::sqrt(static_cast<float>(cols));
    void* out = s->MutableData();
    for (int64_t i = 0; i < n; ++i) {
      const float v = rng_.Symmetric() * scale;
      switch (dtype) {
        case kernels::DType::kF32:
          static_cast<float*>(out)[i] = v;
          break;
        case kernels::DType::kF16:
          static_cast<uint16_t*>(out)[i] = F32ToF16(v);
          break;
        case kernels::DType::kBF16:
          static_cast<uint16_t*>(out)[i] = F32ToBf16(v);
          break;
        case kernels::DType::kI8:  // random models are made in a float type
        case kernels::DType::kF8E4M3:
          break;
      }
    }
    return Keep(std::move(s), dtype, rows, cols);
  }

  // A [1, n] fp32 vector filled with `value`.
  absl::StatusOr<kernels::Matrix> Constant(int64_t n, float value) {
    RECALL_ASSIGN_OR_RETURN(std::unique_ptr<HeapStorage> s,
                            HeapStorage::Create(static_cast<size_t>(n) * sizeof(float)));
    float* out = static_cast<float*>(s->MutableData());
    for (int64_t i = 0; i < n; ++i) out[i] = value;
    return Keep(std::move(s), kernels::DType::kF32, 1, n);
  }

 private:
  kernels::Matrix Keep(std::unique_ptr<HeapStorage> s, kernels::DType dtype, int64_t rows,
                       int64_t cols) {
    kernels::Matrix m{s->data(), dtype, rows, cols};
    model_->storage.push_back(std::move(s));
    return m;
  }

  Model* model_;
  Rng rng_;
};

}  // namespace

int64_t RandomModelBytes(const ModelConfig& config, kernels::DType dtype) {
  const int64_t D = config.dim, H = config.hidden_dim, V = config.vocab_size;
  const int64_t hd = config.head_dim > 0 ? config.head_dim : D / std::max(1, config.n_heads);
  const int64_t q = config.n_heads * hd, kv = config.n_kv_heads * hd;
  const int64_t matrices = V * D * (config.tied_embeddings ? 1 : 2) +
                           config.n_layers * (2 * q * D + 2 * kv * D + 3 * H * D);
  const int64_t vectors = D + config.n_layers * (2 * D + (config.qkv_bias ? q + 2 * kv : 0) +
                                                 (config.qk_norm ? 2 * hd : 0));
  return matrices * static_cast<int64_t>(kernels::DTypeSize(dtype)) +
         vectors * static_cast<int64_t>(sizeof(float));
}

absl::StatusOr<std::unique_ptr<Model>> MakeRandomModel(const ModelConfig& config,
                                                       kernels::DType dtype, uint64_t seed) {
  auto model = std::make_unique<Model>();
  ModelConfig& c = model->config;
  c = config;
  if (c.head_dim == 0 && c.n_heads > 0) c.head_dim = c.dim / c.n_heads;
  c.weight_dtype = dtype;
  RECALL_RETURN_IF_ERROR(Annotate(c.Validate(), "MakeRandomModel"));
  if (dtype != kernels::DType::kF32 && dtype != kernels::DType::kF16 &&
      dtype != kernels::DType::kBF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("MakeRandomModel: unknown dtype ", static_cast<int>(dtype)));
  }

  Filler f(model.get(), seed);
  const int64_t D = c.dim, H = c.hidden_dim, hd = c.head_dim;
  const int64_t q = c.n_heads * hd, kv = c.n_kv_heads * hd;
  RECALL_ASSIGN_OR_RETURN(model->tok_embeddings, f.Random(c.vocab_size, D, dtype));
  model->layers.resize(c.n_layers);
  for (LayerWeights& w : model->layers) {
    RECALL_ASSIGN_OR_RETURN(w.attn_norm, f.Constant(D, 1.0f));
    RECALL_ASSIGN_OR_RETURN(w.wq, f.Random(q, D, dtype));
    RECALL_ASSIGN_OR_RETURN(w.wk, f.Random(kv, D, dtype));
    RECALL_ASSIGN_OR_RETURN(w.wv, f.Random(kv, D, dtype));
    RECALL_ASSIGN_OR_RETURN(w.wo, f.Random(D, q, dtype));
    if (c.qkv_bias) {
      RECALL_ASSIGN_OR_RETURN(w.bq, f.Constant(q, 0.0f));
      RECALL_ASSIGN_OR_RETURN(w.bk, f.Constant(kv, 0.0f));
      RECALL_ASSIGN_OR_RETURN(w.bv, f.Constant(kv, 0.0f));
    }
    if (c.qk_norm) {
      RECALL_ASSIGN_OR_RETURN(w.q_norm, f.Constant(hd, 1.0f));
      RECALL_ASSIGN_OR_RETURN(w.k_norm, f.Constant(hd, 1.0f));
    }
    RECALL_ASSIGN_OR_RETURN(w.ffn_norm, f.Constant(D, 1.0f));
    RECALL_ASSIGN_OR_RETURN(w.w_gate, f.Random(H, D, dtype));
    RECALL_ASSIGN_OR_RETURN(w.w_up, f.Random(H, D, dtype));
    RECALL_ASSIGN_OR_RETURN(w.w_down, f.Random(D, H, dtype));
  }
  RECALL_ASSIGN_OR_RETURN(model->final_norm, f.Constant(D, 1.0f));
  if (c.tied_embeddings) {
    model->lm_head = model->tok_embeddings;
  } else {
    RECALL_ASSIGN_OR_RETURN(model->lm_head, f.Random(c.vocab_size, D, dtype));
  }
  model->source = absl::StrCat("random(seed=", seed, ")");
  return model;
}

}  // namespace recall::model
