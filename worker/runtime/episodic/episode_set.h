// BuildEpisodeSet: EpiCache's offline part for one history (EVICTION.md section 2, steps
// 2-6): embed the windows, cluster them into episodes, and build one compressed cache per
// episode by block-wise prefill judged by its patched prompt; every cache ends offloaded to
// host memory, so the pool holds at most budget + one block while building.
//
// Used by EpisodicSequence (a single long prompt) and by the serving scheduler's episode
// builder (a session's transcript, off the serving path).
//
// Not thread safe: the caller owns the forward pass, the pool and the embedder.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cache/block_pool.h"
#include "cache/episodic/embedder.h"
#include "cache/episodic/episodes.h"
#include "cache/episodic/segment.h"
#include "cache/sequence_cache.h"
#include "worker/runtime/episodic/block_prefill.h"
#include "worker/runtime/forward.h"
#include "worker/tokenizer/tokenizer.h"

namespace recall::runtime::episodic {

inline constexpr char kDefaultInstruction[] =
    "Remember the key information in the conversation above, about the following:\n";

struct EpisodeBuildOptions {
  int episodes = 4;       // E: clusters at most (fewer when there are fewer windows)
  int patch_windows = 8;  // windows per patched prompt
  // Prefixed to every patched prompt when it takes at most half of the patch's room (half a
  // block); the windows' text fills the rest, losing its beginning when too long.
  std::string instruction = kDefaultInstruction;
  BlockPrefillOptions block;
  uint64_t seed = 1;  // k-means
  int restarts = 10;  // k-means restarts
};

struct EpisodeSet {
  std::vector<cache::episodic::Episode> episodes;
  std::vector<std::unique_ptr<cache::SequenceCache>> caches;  // [episodes], offloaded
  std::vector<std::vector<int32_t>> patches;  // [episodes] the patched prompts' tokens
  int64_t build_peak_bytes = 0;               // the most KV bytes the pool held for one build
  double embed_seconds = 0;                   // embedding and clustering
  double build_seconds = 0;                   // block-wise prefill of every episode
};

// `embedder`: a HashedTfIdfEmbedder is fitted on the windows first. `budgets`: one per
// layer. Errors: the embedder's, KMeans', BlockwisePrefill's; InvalidArgument for no windows.
absl::StatusOr<EpisodeSet> BuildEpisodeSet(ForwardPass& forward, cache::BlockPool& pool,
                                           const model::Tokenizer& tokenizer,
                                           cache::episodic::Embedder& embedder,
                                           const std::vector<cache::episodic::Window>& windows,
                                           std::span<const int32_t> history,
                                           std::span<const int32_t> budgets,
                                           const EpisodeBuildOptions& options);

// The episode for a query embedding, or when routing has no answer (a zero embedding), the
// episode holding window `fallback_window` (0 if none does). `fell_back` says which.
int RouteOrFallBack(std::span<const float> query,
                    const std::vector<cache::episodic::Episode>& episodes, int fallback_window,
                    bool* fell_back);

}  // namespace recall::runtime::episodic
