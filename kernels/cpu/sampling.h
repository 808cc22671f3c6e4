// Sampler: picks the next token from logits (Backend::Sample).
//   1. repetition penalty over the distinct tokens of history (logit > 0 ? logit / p :
//      logit * p), also when greedy;
//   2. temperature 0: argmax, ties to the lowest id (the rng is not advanced);
//   3. otherwise logits /= temperature, softmax, keep the top_k most likely (if top_k > 0),
//      then the smallest most-likely prefix whose mass reaches top_p of the kept mass (if
//      top_p < 1), renormalise and draw with one rng.NextFloat().
// Candidates are ranked by scaled logit, ties to the lowest id, so top_k = 1 and a tiny
// top_p give exactly the greedy token. Workspaces grow once to the vocabulary size.
// Not thread safe: one caller at a time.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/sampling_params.h"

namespace recall::kernels::cpu {

class Sampler {
 public:
  // logits: [vocab], modified in place (penalty, temperature); history: [n_history].
  int32_t Sample(float* logits, int vocab, const SamplingParams& params, Rng& rng,
                 const int32_t* history, int n_history);

  // Steps 2 and 3 alone (no repetition penalty), with `draw` in [0, 1) in place of
  // rng.NextFloat(): Sample(logits, ..., rng, ...) == Pick(logits, ..., rng.NextFloat()) when
  // the penalty is off and temperature > 0, and the argmax when temperature <= 0 (the draw
  // unused). logits: [vocab], modified in place (temperature).
  int32_t Pick(float* logits, int vocab, const SamplingParams& params, float draw);

 private:
  void ApplyRepetitionPenalty(float* logits, int vocab, float penalty, const int32_t* history,
                              int n_history);

  std::vector<uint8_t> seen_;   // [vocab] marks during the penalty pass; all zero between
  std::vector<float> probs_;    // [vocab]
  std::vector<int32_t> order_;  // candidate ids, most likely first
};

// OpenAI's frequency and presence penalties: every distinct token t of reply[0, n_reply)
// within [0, vocab), seen c times, loses params.frequency_penalty * c +
// params.presence_penalty from logits[t]. Callers apply it before Sample, on the tokens
// generated so far in this reply (a resumed reply's tokens included).
void ApplyReplyPenalties(float* logits, int vocab, const SamplingParams& params,
                         const int32_t* reply, int n_reply);

// Index of the largest value; ties to the lowest index. REQUIRES: n >= 1.
int32_t ArgMax(const float* x, int n);

}  // namespace recall::kernels::cpu
