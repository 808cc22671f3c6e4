// LayerSensitivity: EpiCache's per-layer sensitivity sigma_l (EVICTION.md §2), the input of
// the sensitivity-based layer budgets (cache/eviction/sensitivity_profile.h).
//
// sigma_l compares the layer's keys (post-RoPE K rows, as stored in the KV cache) under two
// passes over the same tokens:
//  - full: ordinary causal attention over everything before the token;
//  - block-masked: the tokens are cut into blocks of `block`; a token of block b attends
//    causally within block b, to the first `sinks` tokens and to the last block / 2 tokens
//    of block b - 1 (the mask of the released code, applied as one pass: those overlap
//    tokens keep the K/V they got when their own block ran). Run block after block in one
//    cache: after block b, every slot but the sinks and b's last half block is compacted
//    away, so every token keeps its true position.
// Block 0 sees the same context in both passes, so only tokens at positions >= block count.
// Those are cut into windows of `window` consecutive tokens (the last may be shorter); per
// (KV head, window) the cosine similarity of the two passes' keys flattened over the window
// (as the released code computes it); sigma_l is the mean over heads and windows. A layer
// whose keys barely depend on distant context has sigma near 1 (layer 0's keys depend on
// the token and its position only: sigma_0 = 1 up to rounding).
//
// Deterministic for a given backend and thread count. Runs its own ForwardPass and block
// pool (two caches of tokens.size() slots); not for a serving pool. Thread compatible.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "worker/model/model.h"

namespace recall::offline {

struct SensitivityOptions {
  int block = 4096;  // block length of the masked pass (>= 2)
  int sinks = 128;   // sink tokens every block sees (in [0, block))
  int window = 100;  // tokens per averaging window (>= 1)
  int chunk = 256;   // tokens per forward pass (>= 1)
};

// sigma_l for every layer of `model`, [n_layers]. The weights must be in the backend's
// memory. InvalidArgument naming the field for a bad option, when tokens.size() <= block
// (no token past block 0) or exceeds the model's context length, or for a token id out of
// range; FailedPrecondition if the backend's KV memory is not host readable (a GPU).
absl::StatusOr<std::vector<double>> LayerSensitivity(const model::Model& model,
                                                     kernels::Backend& backend,
                                                     std::span<const int32_t> tokens,
                                                     const SensitivityOptions& options = {});

}  // namespace recall::offline
