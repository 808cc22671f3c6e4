// The quality benchmark's evaluation set: texts the model samples itself, and the recall
// probes found in them.
//
// Each text is exactly `length` tokens (the model's context): BOS, a prompt, then sampled
// tokens. Sampling does not stop at BOS: the model starts a new story after it, as in its
// training data (stories separated by BOS), so a text can hold several stories.
//
// A recall probe is a name (a capitalised word that is not a common sentence opener) that
// the text states within its first `early` tokens and that occurs again at position
// >= `late`; its value is the teacher-forced probability of the whole word (product over
// its tokens) at that late occurrence.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cache/block_pool.h"
#include "worker/runtime/forward.h"
#include "worker/tokenizer/tokenizer.h"

namespace recall::bench {

struct EvalSetOptions {
  int n_texts = 16;
  int length = 512;            // tokens per text, BOS included
  float temperature = 1.0f;
  float top_p = 0.95f;
  uint64_t seed = 1;           // text i is sampled with seed + i
  std::vector<std::string> prompts = {"Once upon a time", "One day", "Lily", "Tom and his dog",
                                      "", "Tim was", "The little bird", "Sue and Ben"};
};

struct EvalText {
  std::vector<int32_t> tokens;  // [length]
  std::string prompt;
  uint64_t seed = 0;
};

// Samples the set with the full cache. InvalidArgument if length exceeds the model's context.
absl::StatusOr<std::vector<EvalText>> SampleEvalSet(runtime::ForwardPass& forward,
                                                    cache::BlockPool& pool,
                                                    const model::Tokenizer& tokenizer,
                                                    const EvalSetOptions& options);

struct RecallProbe {
  int text = 0;       // index into the set
  int start = 0;      // position of the word's first token at the late occurrence
  int n_tokens = 0;   // tokens of the word
  int first = 0;      // position of its first (early) occurrence
  std::string name;
};

// All late occurrences (start >= late) of names first stated before `early`.
std::vector<RecallProbe> FindRecallProbes(const model::Tokenizer& tokenizer,
                                          const std::vector<EvalText>& texts, int early,
                                          int late);

}  // namespace recall::bench
