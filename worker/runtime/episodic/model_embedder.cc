#include "worker/runtime/episodic/model_embedder.h"

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "cache/sequence_cache.h"
#include "common/status.h"

namespace recall::runtime::episodic {

absl::StatusOr<std::unique_ptr<ModelEmbedder>> ModelEmbedder::Create(
    const model::Model& model, kernels::Backend& backend, const model::Tokenizer& tokenizer,
    const ModelEmbedderOptions& options) {
  const model::ModelConfig& c = model.config;
  ModelEmbedderOptions o = options;
  if (o.layer == -1) o.layer = c.n_layers / 2;
  if (o.layer < 0 || o.layer >= c.n_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("embedder layer: ", o.layer, " is outside [0, ", c.n_layers, ")"));
  }
  if (o.max_tokens < 1 || o.max_tokens >= c.max_seq_len) {
    return absl::InvalidArgumentError(absl::StrCat("embedder max_tokens: ", o.max_tokens,
                                                   " is outside [1, ", c.max_seq_len, ")"));
  }
  if (o.chunk < 1) {
    return absl::InvalidArgumentError(absl::StrCat("embedder chunk: ", o.chunk, " must be >= 1"));
  }
  const kernels::PagedKvLayout layout{c.n_layers, c.n_kv_heads, c.head_dim, 16};
  RECALL_ASSIGN_OR_RETURN(
      std::unique_ptr<cache::BlockPool> pool,
      cache::BlockPool::Create(layout, c.n_layers * ((o.max_tokens + 15) / 16 + 1),
                               backend.memory()));
  return std::unique_ptr<ModelEmbedder>(
      new ModelEmbedder(model, backend, tokenizer, o, std::move(pool)));
}

ModelEmbedder::ModelEmbedder(const model::Model& model, kernels::Backend& backend,
                             const model::Tokenizer& tokenizer, const ModelEmbedderOptions& options,
                             std::unique_ptr<cache::BlockPool> pool)
    : model_(model),
      tokenizer_(tokenizer),
      options_(options),
      pool_(std::move(pool)),
      forward_(model, backend, ForwardOptions{.max_batch_tokens = options.chunk}) {}

absl::StatusOr<std::vector<float>> ModelEmbedder::Embed(std::string_view text) const {
  std::vector<int32_t> tokens = tokenizer_.Encode(std::string(text), options_.add_bos);
  if (static_cast<int>(tokens.size()) > options_.max_tokens) tokens.resize(options_.max_tokens);
  const int first = options_.add_bos ? 1 : 0;  // the BOS is left out of the mean
  std::vector<float> sum(static_cast<size_t>(dim()), 0.0f);
  const int pooled = static_cast<int>(tokens.size()) - first;
  if (pooled <= 0) return sum;  // nothing to embed: the zero vector
  absl::MutexLock lock(&mu_);
  cache::SequenceCache cache(pool_.get());
  for (size_t begin = 0; begin < tokens.size(); begin += options_.chunk) {
    BatchItem item;
    item.cache = &cache;
    item.tokens = tokens.data() + begin;
    item.n = static_cast<int>(std::min<size_t>(options_.chunk, tokens.size() - begin));
    item.want_logits = false;
    item.hidden_sum = sum.data();
    item.hidden_layer = options_.layer;
    item.hidden_from = first;
    RECALL_RETURN_IF_ERROR(forward_.Run({&item, 1}, nullptr));
  }
  double norm = 0;
  for (float v : sum) norm += static_cast<double>(v) * v;
  norm = std::sqrt(norm);
  if (!(norm > 0) || !std::isfinite(norm)) {
    return absl::InternalError("embedder: the pooled hidden state is zero or not finite");
  }
  for (float& v : sum) v = static_cast<float>(v / norm);
  return sum;
}

}  // namespace recall::runtime::episodic
