// Many KV-cache configurations of one text in one ForwardPass batch: the benchmarks' shared
// machinery. Run 0 is the full-cache reference (no evictor); run i > 0 has its own
// SequenceCache and SessionEvictor (policy and budget of specs[i - 1]), stepped after every
// decode forward with the run's attention probabilities, as the serving engine does.
// Not thread safe (uses the ForwardPass).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cache/block_pool.h"
#include "cache/eviction/session_evictor.h"
#include "cache/sequence_cache.h"
#include "worker/offline/log_probs.h"
#include "worker/runtime/forward.h"

namespace recall::bench {

struct RunSpec {
  std::string policy;
  int budget_tokens = 0;  // C per (layer, KV head)
};

struct PolicyKnobs {
  int window = 16;  // W
  float alpha = 1e-4f;
  int sinks = 4;
  std::string layer_budgets = "uniform";  // as recall serve's --layer-budgets
  double layer_alpha = 1.2;
  double value_protection = 0;          // recall serve's --value-protection
  double alpha_uniform = 0;             // recall serve's --alpha-uniform (lazy+)
  std::string tp_eviction = "uniform";  // recall serve's --tp-eviction (head-adaptive)
  // A benchmark knob the serving settings do not expose: CAOTE over the policy's score.
  cache::eviction::PolicyOptions::MetaScore meta_score =
      cache::eviction::PolicyOptions::MetaScore::kNone;
  // Merging evicted tokens (cache/eviction/merge.h): off when merge_similarity > 1.
  double merge_similarity = 2;
  bool merge_keys = false;
  // lazy+'s attention term (PolicyOptions::attention_decay / attention_weight).
  float attention_decay = cache::eviction::PolicyOptions().attention_decay;
  float attention_weight = cache::eviction::PolicyOptions().attention_weight;
};

struct Run {
  std::unique_ptr<cache::SequenceCache> seq;
  std::unique_ptr<cache::eviction::SessionEvictor> evictor;  // null for run 0
  std::vector<float> probs;  // [n_layers, n_heads, stride] when the policy reads attention
};

// Run 0 (full) and one run per spec. InvalidArgument (from the evictor) for a bad policy or
// budget, naming it.
absl::StatusOr<std::vector<Run>> MakeRuns(runtime::ForwardPass& forward, cache::BlockPool& pool,
                                          const std::vector<RunSpec>& specs,
                                          const PolicyKnobs& knobs, uint64_t session);

// Prefills tokens[0, n) into every run, one run at a time; logits: [runs, vocab].
// Prefill-time policies (SnapKV) then compress the prompt from its last `window` queries.
absl::Status PrefillRuns(runtime::ForwardPass& forward, std::vector<Run>& runs,
                         const int32_t* tokens, int n, float* logits);

// One decode step of the runs in `active` (indices into runs), feeding tokens[j] to
// runs[active[j]]; logits come back in the order of `active`. Steps the evictors.
absl::Status DecodeRuns(runtime::ForwardPass& forward, std::vector<Run>& runs,
                        const std::vector<int>& active, const int32_t* tokens, float* logits);

// worker/offline/log_probs.h, under the names the benchmarks use.
using offline::Argmax;
using offline::LogSoftmax;

}  // namespace recall::bench
