// The conversation benchmark's measurements: recall-question accuracy of every method at
// every budget on one held-out conversation (conversation_set.h), and agreement with FullKV.
//
// Policies (streaming, h2o, tova, lazy, ...): all (policy, budget) runs and the FullKV
// reference (run 0) are items of one ForwardPass batch (batch_runs.h). After a `prefix`-token
// prefill, the conversation, "[Questions]" and then every question with its correct answer
// are fed token by token, the evictors stepping after every token, so each cache holds its
// budget along the whole conversation and is compressed before it sees any question. (A
// serving session's cache is bounded before the next question as well, but a long user
// message is prefilled whole and compressed while the reply decodes.)
// Episodic (EpiCache): per question, the conversation, "[Questions]" and that one question
// are the prompt of an EpisodicSequence (episodes built block-wise, the question routed to
// one), compared with a FullKV LocalSequence on the same prompt.
//
// Scoring, teacher-forced along the correct answer (" <answer>" and its newline): a question
// is correct when every answer token is the argmax (what greedy decoding would write), and
// agrees with FullKV when every answer position's argmax equals FullKV's.
// Not thread safe (uses the ForwardPass).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/quality/batch_runs.h"
#include "bench/quality/conversation_set.h"
#include "cache/block_pool.h"
#include "worker/runtime/forward.h"
#include "worker/tokenizer/tokenizer.h"

namespace recall::bench {

struct ConvMethod {
  std::string label;  // "lazy", "streaming", "episodic-tfidf", ...
  bool episodic = false;
  std::string policy;     // !episodic: the eviction policy
  std::string embedder;   // episodic: "model" or "tfidf"
  double fraction = 0;    // budget: ceil(fraction * conversation tokens) per (layer, KV head)
  int budget_tokens = 0;  // or this many (when > 0)

  int Budget(const QaConversation& c) const;
};

// Parses "episodic-<embedder>" or a policy name. InvalidArgument for an empty label.
absl::StatusOr<ConvMethod> ParseConvMethod(const std::string& label);

struct ConvEvalOptions {
  PolicyKnobs knobs;
  int prefix = 16;         // tokens prefilled before the token-by-token feed
  int far_tokens = 512;    // a question is "far" when its answer was last stated this far back
  int episodes = 4;        // episodic: E
  int block_tokens = 512;  // episodic: block-wise prefill block
  int recent = 4;          // episodic: sentences kept uncompressed before the question
  int chunk = 256;         // episodic and its reference: prefill chunk
};

// Sums over questions; divided out by the report.
struct ConvStats {
  int64_t questions = 0, correct = 0;
  int64_t far = 0, far_correct = 0;
  int64_t agree = 0;                               // all answer argmaxes equal FullKV's
  int64_t answer_tokens = 0, token_agree = 0;      // per answer position
  int64_t full_correct = 0, far_full_correct = 0;  // FullKV on the same questions
  double kv_fraction_sum = 0;  // device KV bytes at the end / FullKV's, per measurement
  int64_t kv_samples = 0;
  double budget_fraction_sum = 0;  // budget / conversation tokens, per conversation
  int64_t conversations = 0;
};

// Evaluates the non-episodic `methods` on `c`, adding to stats[i] for methods[i];
// full_stats gets the FullKV reference's own figures. InvalidArgument for a bad policy or
// budget (naming it) or a prefix outside [1, context).
absl::Status EvaluatePolicies(runtime::ForwardPass& forward, cache::BlockPool& pool,
                              const QaConversation& c, const std::vector<ConvMethod>& methods,
                              const ConvEvalOptions& options, std::vector<ConvStats>* stats,
                              ConvStats* full_stats);

// Evaluates the episodic `methods` on `c`, one prompt per question; full_stats gets the
// single-question FullKV reference's figures.
absl::Status EvaluateEpisodic(runtime::ForwardPass& forward, cache::BlockPool& pool,
                              const model::Tokenizer& tokenizer, const QaConversation& c,
                              const std::vector<ConvMethod>& methods,
                              const ConvEvalOptions& options, std::vector<ConvStats>* stats,
                              ConvStats* full_stats);

}  // namespace recall::bench
