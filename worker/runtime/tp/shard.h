// Megatron-style sharding of a model over `tp` ranks (ARCHITECTURE.md "Tensor parallel").
//
// Rank r holds:
//  - query heads [r * Hq/tp, (r + 1) * Hq/tp): the rows of wq (and bq) for them, and the
//    matching COLUMNS of wo (row-parallel: its partial output is all-reduced);
//  - KV heads: Hkv/tp of them when tp <= Hkv; when tp > Hkv (tp a multiple of Hkv) each rank
//    holds the one KV head its query heads use, so KV heads are replicated tp/Hkv times;
//  - MLP columns [r * F/tp, (r + 1) * F/tp): rows of w_gate and w_up, columns of w_down
//    (row-parallel, all-reduced);
//  - the embedding, norms and LM head replicated (views, no copy).
// Row slices are views into the full model's memory (a mapped file is only touched where the
// rank reads); column slices (wo, w_down) are copied into the shard's own storage.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "worker/model/model.h"

namespace recall::runtime::tp {

struct TpLayout {
  int tp = 1;
  int rank = 0;
  int q_heads = 0;         // query heads on this rank
  int q_head_offset = 0;   // model-global index of this rank's query head 0
  int kv_heads = 0;        // KV heads on this rank
  int kv_head_offset = 0;  // model-global index of this rank's KV head 0
  int hidden = 0;          // MLP columns on this rank
  int hidden_offset = 0;
};

// InvalidArgument naming the constraint unless tp >= 1, 0 <= rank < tp, Hq % tp == 0,
// F % tp == 0, and Hkv % tp == 0 or tp % Hkv == 0.
absl::StatusOr<TpLayout> MakeTpLayout(const model::ModelConfig& config, int tp, int rank);

// Rank `rank`'s shard of `full`: config with the rank's head and MLP counts, weights as
// above. The shard views `full`'s memory: `full` must outlive it.
absl::StatusOr<std::unique_ptr<model::Model>> ShardModel(const model::Model& full, int tp,
                                                         int rank);

}  // namespace recall::runtime::tp
