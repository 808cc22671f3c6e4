// The episodic benchmark's measurements on one conversation (story_set.h): the FullKV
// reference and one method (FullKV, an eviction policy, or EpiCache) at one budget.
//
//   - free-running greedy continuation (argmax, ties to the lowest id) of at most
//     `max_new` tokens, ending early at BOS or EOS (llama2.c: BOS ends a story);
//   - teacher-forced: FullKV's greedy continuation fed into the method's sequence; per
//     position the method's log-probabilities (KL against FullKV, top-1 agreement, and the
//     probability of the story's names where FullKV's continuation says them);
//   - what the method's cache holds: device KV bytes, and how much of the prompt's stories
//     it kept belongs to the restarted story (for EpiCache also per episode, to check the
//     routing and the episodes' budgets).
// Not thread safe (uses the ForwardPass).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/quality/story_set.h"
#include "cache/block_pool.h"
#include "worker/offline/sentences.h"
#include "worker/runtime/forward.h"
#include "worker/tokenizer/tokenizer.h"

namespace recall::bench {

// A conversation as tokens, with the token spans the metrics need.
struct StoryPrompt {
  std::vector<int32_t> tokens;                       // BOS + the whole text, tokenized once
  std::vector<offline::TokenSpan> stories;           // per story, in prompt order
  offline::TokenSpan query;
  int target = 0;                                // index into `stories`
  std::string name, companion;                   // the restarted story's
  std::vector<std::string> other_names;          // every other story's name and companion
  std::vector<int32_t> name_ids, companion_ids;  // Encode(name) without BOS ("▁Name...")
  // The restarted story's own text after its first sentence (the query), as it tokenizes
  // after the prompt, and where it names the main character and the companion.
  std::vector<int32_t> original;
  std::vector<int> original_name_at, original_companion_at;
  // Sentence index range [first, end) of every story (SplitSentences order, BOS excluded).
  std::vector<std::pair<int, int>> story_sentences;
};

// How the stories and the query are put together: "space" (one text, tokenized once with a
// leading BOS) or "bos" (BOS before every story and before the query, as llama2.c packs
// TinyStories: each segment is tokenized on its own after its BOS).
// Tokenizes `c` and maps its sentences (offline::SplitSentences, as EpiCache sees
// them) to its stories. Internal if the sentence count differs from the stories', or if the
// prompt followed by the story's own continuation does not tokenize to the prompt's tokens
// followed by more.
absl::StatusOr<StoryPrompt> PreparePrompt(const Conversation& c, const model::Tokenizer& tokenizer,
                                          const std::string& separator);

// Where a continuation says a name: position of its first token.
std::vector<int> FindName(const std::vector<int32_t>& tokens, const std::vector<int32_t>& ids,
                          const model::Tokenizer& tokenizer);

struct Method {
  std::string label;     // "full", "lazy", "episodic-model", "episodic-tfidf-r0", ...
  std::string kind;      // "full", "policy" or "episodic"
  std::string policy;    // kind "policy": lazy, snapkv, h2o, streaming, tova, ...
  std::string embedder;  // kind "episodic": model or tfidf
  int recent = 4;        // kind "episodic": recent_utterances
};

// Parses a label: "full", "episodic-<embedder>[-r<recent>]" or a policy name.
absl::StatusOr<Method> ParseMethod(const std::string& label, int default_recent);

struct EvalSettings {
  int budget = 64;  // C, tokens per (layer, KV head)
  int window = 16;  // W
  float alpha = 1e-4f;
  int sinks = 4;
  int episodes = 4;
  int block_tokens = 128;
  int max_new = 48;
};

// The FullKV reference on one prompt.
struct Reference {
  std::vector<int32_t> tokens;            // greedy continuation, stop token included if any
  std::vector<std::vector<double>> logp;  // [tokens fed + 1][vocab] log-softmax per position
  std::string text;                       // decoded continuation (stop token excluded)
  double prefill_seconds = 0;             // one-shot prefill of the prompt (median of 3)
  int64_t prefill_kv_bytes = 0;           // KV bytes after that prefill
  int64_t final_kv_bytes = 0;
  std::vector<int> name_at, companion_at;  // FindName in `tokens`
  std::vector<double> original_logp;       // log p_full(StoryPrompt::original[i])
};

absl::StatusOr<Reference> RunReference(runtime::ForwardPass& forward, cache::BlockPool& pool,
                                       const model::Tokenizer& tokenizer, const StoryPrompt& prompt,
                                       int max_new);

struct EpisodeCheck {
  double target_share = 0;           // of its kept history slots, the restarted story's share
  int max_history_slots = 0;         // most history slots any (layer, head) keeps
  int dominant_story = -1;           // index into StoryPrompt::stories holding most of its slots
  std::vector<double> story_shares;  // of its kept history slots, each story's share
  int64_t kv_bytes = 0;
  bool resident = false;
  // From the routing replica (see MethodRun::replica_active): its history windows, and
  // whether one of them holds a sentence of the restarted story.
  std::vector<int> windows;
  bool has_target_window = false;
};

struct MethodRun {
  // Free-running.
  std::vector<int32_t> tokens;  // stop token included if any
  std::string text;
  double prefill_seconds = 0;
  int64_t peak_kv_bytes = 0;
  int64_t final_kv_bytes = 0;     // on the device, after the continuation
  int64_t tf_final_kv_bytes = 0;  // on the device, after the teacher-forced continuation
  int64_t total_kv_bytes = 0;     // tf_final plus every other episode's host copy
  double target_share_end = 0;    // of the kept story slots at the end
  // Teacher-forced along the reference's continuation.
  std::vector<double> ref_logp;  // log p(reference token i)
  double kl_sum = 0;             // KL(full || method) over the positions
  int top1 = 0;                  // argmax == reference token
  int positions = 0;
  // Teacher-forced along the restarted story's own text (StoryPrompt::original).
  std::vector<double> original_logp;
  // EpiCache (the free-running run's sequence; the teacher-forced one is identical).
  bool clustered = false;
  int active = -1;
  bool routed_by_fallback = false;
  double embed_seconds = 0, build_seconds = 0;  // mean of the two runs
  int64_t build_peak_bytes = 0;
  int history_tokens = 0, recent_tokens = 0;
  std::vector<EpisodeCheck> episodes;  // after Prefill
  // Mean over pairs of episodes of |A and B| / |A or B|, A and B the (layer, head, position)
  // sets of history slots they keep: 1 when every episode kept the same tokens.
  double episode_overlap = 0;
  // The routing, replayed outside the engine with the same windows, embedder and k-means
  // options (EpisodicOptions defaults): the episode it routes to (should equal `active`),
  // and whether that episode has a window of the restarted story.
  int replica_active = -1;
  bool routed_to_target_window = false;
  int windows = 0;
};

absl::StatusOr<MethodRun> RunMethod(runtime::ForwardPass& forward, cache::BlockPool& pool,
                                    const model::Tokenizer& tokenizer, const StoryPrompt& prompt,
                                    const Reference& reference, const Method& method,
                                    const EvalSettings& settings);

}  // namespace recall::bench
