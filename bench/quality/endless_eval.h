// The endless benchmark's measurements (endless_bench.cc): texts several times the model's
// context made of stories the model samples itself, the per-position negative log-likelihood
// of such a text through a compact (endless) evicting cache and through the sliding-window
// baseline that recomputes the last M tokens at every position, and the decode step time of
// one long endless session.
//
// Not thread safe (each call drives the ForwardPass it is given).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "cache/block_pool.h"
#include "worker/runtime/forward.h"
#include "worker/serving/cache_factory.h"
#include "worker/tokenizer/tokenizer.h"

namespace recall::bench {

struct EndlessTextOptions {
  int n_texts = 6;
  int length = 2048;  // tokens per text
  uint64_t seed = 1;  // story k (over all texts, from 0) is sampled with StorySeed(seed, k)
  float temperature = 1.0f;
};

// Story k's sampling seed: seed * 1,000,000 + k, so different --seed values give disjoint
// stories (for fewer than a million stories).
inline uint64_t StorySeed(uint64_t seed, int k) {
  return seed * 1000000 + static_cast<uint64_t>(k);
}

struct EndlessText {
  std::vector<int32_t> tokens;        // [length]
  std::vector<uint64_t> story_seeds;  // of the stories it is made of, in order
  int capped = 0;  // stories that ran to the context length without ending (BOS or EOS)
};

// Each text is the concatenation of stories, each sampled from BOS with the full cache
// within the model's context (temperature `temperature`, no top-k or top-p) until the model
// emits BOS or EOS (not kept: the next story starts with its own BOS) or the context is
// full; the last story is cut at `length`.
absl::StatusOr<std::vector<EndlessText>> SampleEndlessTexts(runtime::ForwardPass& forward,
                                                            cache::BlockPool& pool,
                                                            const model::Tokenizer& tokenizer,
                                                            const EndlessTextOptions& options);

// nll[t] = -log p(tokens[t] | tokens[0, t)) in nats for 1 <= t < tokens.size(); nll[0] is NaN.
using Nll = std::vector<double>;

// The full cache (original positions) over tokens[0, n) (n <= the context): nll of
// targets 1 .. n-1 (NaN past them).
absl::StatusOr<Nll> FullCacheNll(runtime::ForwardPass& forward, cache::BlockPool& pool,
                                 const std::vector<int32_t>& tokens, int n);

struct CompactRun {
  Nll nll;
  int64_t peak_kv_bytes = 0;  // SequenceStats::peak_kv_bytes
  int peak_slots = 0;         // the most slots any (layer, KV head) held (after an append)
  int64_t evictions = 0;
  int64_t evicted_slots = 0;
  int compactions = 0;  // times the cache was re-positioned
  // How old the held tokens are (the token being fed minus the held token's index in the
  // text), over every held slot of every (layer, KV head) after every step that fed a
  // token at or past `context`: the mean, and the share of slots older than `context`.
  double mean_age = 0;
  double share_older_than_context = 0;
  double seconds = 0;
};

// Teacher-forces `tokens` through a LocalSequence made from `spec` (its positions must be
// compact): the first token prefilled, then one Decode per token.
absl::StatusOr<CompactRun> TeacherForceCompact(runtime::ForwardPass& forward,
                                               cache::BlockPool& pool,
                                               const serving::SessionCacheSpec& spec,
                                               const std::vector<int32_t>& tokens);

// The sliding window with recompute: for every target t, tokens[max(0, t - m), t) prefilled
// into a fresh full cache at positions 0.., nll[t] from the last logits.
absl::StatusOr<Nll> SlidingWindowNll(runtime::ForwardPass& forward, cache::BlockPool& pool,
                                     const std::vector<int32_t>& tokens, int m);

struct StepTimeOptions {
  int tokens = 20032;                       // tokens fed (the session's length)
  std::vector<int> centers = {500, 20000};  // positions the windows are centred on
  int steps = 64;     // steps per window: [center - steps/2, center + steps/2)
  uint64_t seed = 1;  // sampling seed (temperature 1)
};

struct StepTimes {
  std::vector<double> median_ms;  // per center
  std::vector<double> mean_ms;
  std::vector<double> max_ms;
  std::vector<int> compactions;  // re-positionings inside each window
  int compactions_total = 0;
  int64_t peak_kv_bytes = 0;
  double seconds = 0;
};

// One session from BOS on a LocalSequence made from `spec`, sampling (temperature 1) and
// feeding `tokens` tokens; a step (Decode of token i, then sampling the next) is timed for
// the i in each window.
absl::StatusOr<StepTimes> TimeDecodeSteps(runtime::ForwardPass& forward, cache::BlockPool& pool,
                                          const serving::SessionCacheSpec& spec, int32_t bos,
                                          const StepTimeOptions& options);

// exp of the mean of nll over targets [from, to) of every text (NaN when there are none).
double Perplexity(const std::vector<Nll>& per_text, int from, int to);

}  // namespace recall::bench
