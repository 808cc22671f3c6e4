// ModelEmbedder: the served model as EpiCache's sentence encoder (cache/episodic/embedder.h).
// A text's embedding is the mean over its tokens of the residual stream after one layer,
// L2-normalised.
//
// The layer: by default the middle one (n_layers / 2, 0-based, counted after its MLP). Mean-
// pooled hidden states of decoder-only models carry the most topical information in the
// middle layers; the last layers specialise in predicting the next token. The BOS token is
// left out of the mean: its residual stream is large and the same for every text (an
// attention sink), so it would pull every embedding toward one direction.
//
// Texts longer than max_tokens keep their first max_tokens tokens. Embed runs its own
// ForwardPass and KV pool (sized once for max_tokens), so it never touches a serving pool;
// calls are serialised by a mutex (thread safe, one at a time).
#pragma once

#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "cache/block_pool.h"
#include "cache/episodic/embedder.h"
#include "kernels/backend.h"
#include "worker/model/model.h"
#include "worker/runtime/forward.h"
#include "worker/tokenizer/tokenizer.h"

namespace recall::runtime::episodic {

struct ModelEmbedderOptions {
  int layer = -1;        // -1: n_layers / 2
  int max_tokens = 256;  // per text, <= the model's context length
  bool add_bos = true;   // encode with BOS (llama2.c / SentencePiece models)
  int chunk = 128;       // tokens per forward pass
};

class ModelEmbedder final : public cache::episodic::Embedder {
 public:
  // model, backend and tokenizer must outlive the embedder; the weights must be in the
  // backend's memory. InvalidArgument naming the field for a layer outside [0, n_layers),
  // max_tokens outside [1, context length) or chunk < 1.
  static absl::StatusOr<std::unique_ptr<ModelEmbedder>> Create(
      const model::Model& model, kernels::Backend& backend, const model::Tokenizer& tokenizer,
      const ModelEmbedderOptions& options = {});

  int dim() const override { return model_.config.dim; }
  int layer() const { return options_.layer; }
  absl::StatusOr<std::vector<float>> Embed(std::string_view text) const override;

 private:
  ModelEmbedder(const model::Model& model, kernels::Backend& backend,
                const model::Tokenizer& tokenizer, const ModelEmbedderOptions& options,
                std::unique_ptr<cache::BlockPool> pool);

  const model::Model& model_;
  const model::Tokenizer& tokenizer_;
  const ModelEmbedderOptions options_;
  std::unique_ptr<cache::BlockPool> pool_;
  mutable absl::Mutex mu_;
  mutable ForwardPass forward_ ABSL_GUARDED_BY(mu_);
};

}  // namespace recall::runtime::episodic
