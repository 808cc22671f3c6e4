// EpisodicSequence: EpiCache (EVICTION.md section 2) on one long prompt, as a Sequence, so
// `recall generate --policy episodic` and the quality benchmark drive it like any other.
//
// The prompt is the history plus a query: its sentences (sentences.h) are the utterances,
// the last one is the query (with the sentences before it while it is shorter than
// kMinQueryTokens: a question followed by "A:"), the `recent_utterances` before it are the
// recent context.
// Prefill:
//   1. The older history's sentences are grouped into windows of `window_utterances`,
//      embedded (the served model's mean-pooled hidden states, or hashed TF-IDF fitted on
//      the windows) and clustered with k-means (k-means++, restarts, fixed seed) into at
//      most `episodes` episodes; each gets a patched prompt: `instruction` followed by its
//      `patch_windows` windows nearest the centroid, in order.
//   2. Per episode, the older history is read block-wise into its own cache, compressed to
//      the per-layer budgets by that episode's patch (block_prefill.h); the cache is then
//      offloaded to host memory, so the device holds at most budget + one block at a time.
//   3. The query is embedded and routed to the nearest episode (the most recent window's
//      episode when routing has no answer: a zero embedding); that cache is restored and the
//      recent sentences and the query are prefilled into it, uncompressed.
//   4. Decode runs on that cache with `decode`'s policy (lazy by default), its budget C.
// A prompt with fewer than two history windows, or whose history fits the budget, is not
// clustered: it is prefilled whole and decoded with `decode`'s policy (one episode).
//
// The other episodes' caches stay on the host; at most one cache is on the device at a
// time. Budgets: every episode's cache holds at most budget_l slots per KV head of layer l
// after its build; the active one grows by the recent context and query until the decode
// policy evicts it back to C.
//
// Not thread safe: one caller drives a sequence.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cache/block_pool.h"
#include "cache/episodic/embedder.h"
#include "cache/episodic/episodes.h"
#include "cache/eviction/session_evictor.h"
#include "worker/offline/sequence.h"
#include "worker/runtime/episodic/block_prefill.h"
#include "worker/runtime/episodic/episode_set.h"
#include "worker/tokenizer/tokenizer.h"

namespace recall::offline {

// The query routed to an episode has at least this many tokens (when the prompt has them).
inline constexpr int kMinQueryTokens = 8;

struct EpisodicOptions {
  int episodes = 4;                // E, >= 1
  int window_utterances = 4;       // utterances per window, >= 1
  int patch_windows = 8;           // windows per patched prompt, >= 1
  int recent_utterances = 4;       // history sentences kept uncompressed before the query, >= 0
  std::string embedder = "model";  // "model" (mean-pooled hidden states) or "tfidf"
  std::string instruction = runtime::episodic::kDefaultInstruction;
  runtime::episodic::BlockPrefillOptions
      block;          // block_tokens (EpiCache: 2048), chunk, head_adaptive
  uint64_t seed = 1;  // k-means
  int restarts = 10;  // k-means restarts
  // Decode-time eviction of the active episode's cache, and the budgets (decode.budget: C
  // and the per-layer split) every episode is compressed to. decode.policy.name must be a
  // decode-time policy (not snapkv, not episodic).
  cache::eviction::SessionEvictorOptions decode;
};

// The names EpisodicOptions::embedder accepts.
const std::vector<std::string>& EpisodicEmbedders();

struct EpisodeInfo {
  std::vector<int> windows;  // its history windows (indices in order)
  int patch_tokens = 0;      // its patched prompt's length
  int64_t kv_bytes = 0;      // its cache's bytes (device or host)
  bool resident = false;     // on the device (the active episode)
};

struct EpisodicStats {
  int history_tokens = 0;           // compressed history (without the recent context and query)
  int recent_tokens = 0;            // recent context + query, prefilled uncompressed
  int active = -1;                  // the episode the query was routed to; -1 when not clustered
  bool routed_by_fallback = false;  // routing had no answer; the most recent episode served
  std::vector<EpisodeInfo> episodes;
  double embed_seconds = 0;      // embedding and clustering
  double build_seconds = 0;      // block-wise prefill of every episode
  int64_t build_peak_bytes = 0;  // the most KV bytes on the device while building
};

class EpisodicSequence final : public Sequence {
 public:
  // InvalidArgument naming the field for bad options (and the decode options' errors).
  // forward, pool and tokenizer must outlive the sequence.
  static absl::StatusOr<std::unique_ptr<EpisodicSequence>> Create(runtime::ForwardPass& forward,
                                                                  cache::BlockPool& pool,
                                                                  const model::Tokenizer& tokenizer,
                                                                  const EpisodicOptions& options);

  absl::Status Prefill(std::span<const int32_t> prompt, int chunk, float* logits) override;
  absl::Status Decode(int32_t token, float* logits) override;
  int32_t next_position() const override;
  SequenceStats stats() const override;

  const EpisodicStats& episodic_stats() const { return stats_; }
  // The active cache (after Prefill).
  const cache::SequenceCache& cache() const { return *caches_[active_cache_]; }
  // Every episode's cache (one when not clustered).
  const std::vector<std::unique_ptr<cache::SequenceCache>>& caches() const { return caches_; }

 private:
  EpisodicSequence(runtime::ForwardPass& forward, cache::BlockPool& pool,
                   const model::Tokenizer& tokenizer, const EpisodicOptions& options,
                   cache::eviction::BudgetAllocator budgets);

  runtime::ForwardPass& forward_;
  cache::BlockPool& pool_;
  const model::Tokenizer& tokenizer_;
  EpisodicOptions options_;
  cache::eviction::BudgetAllocator budgets_;
  std::unique_ptr<cache::episodic::Embedder> embedder_;
  std::vector<cache::episodic::Episode> episodes_;
  std::vector<std::unique_ptr<cache::SequenceCache>> caches_;
  int active_cache_ = 0;
  // Prefill of the recent context and query, and decoding, on the active cache.
  std::unique_ptr<LocalSequence> active_;
  EpisodicStats stats_;
};

}  // namespace recall::offline
