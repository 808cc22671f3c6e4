// Sampling parameters for one sequence, with their defaults.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace recall::kernels {

struct SamplingParams {
  float temperature = 1.0f;         // 0 = greedy (argmax; ties to the lowest id)
  int top_k = 0;                    // 0 = off; otherwise keep the k most likely tokens
  float top_p = 1.0f;               // nucleus mass in (0, 1]; 1 = off
  float repetition_penalty = 1.0f;  // CTRL-style: logit/p if > 0 else logit*p, over history
  uint64_t seed = 0;                // seeds the per-sequence RNG
  // Added to these tokens' logits before a pick (after the repetition penalty), by token id.
  std::vector<std::pair<int32_t, float>> logit_bias;
  // OpenAI's additive penalties over the reply so far (not the prompt): a token seen c times
  // in it loses frequency_penalty * c + presence_penalty (c > 0) from its logit, before the
  // repetition penalty and the bias. The caller applies them (ApplyReplyPenalties), as only
  // it knows where the reply starts. 0 = off.
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
};

inline bool HasReplyPenalties(const SamplingParams& p) {
  return p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f;
}

// True when Sample's choice depends on the logits alone (no repetition or reply penalty, which
// need the sequence's tokens, and no logit bias, which the device kernels do not apply), so a
// backend may pick it where the logits are (Backend::SampleRows), given the one uniform
// draw Sample would take from its Rng.
inline bool SamplesOnBackend(const SamplingParams& p) {
  return (p.repetition_penalty == 1.0f || p.repetition_penalty <= 0.0f) && p.logit_bias.empty() &&
         !HasReplyPenalties(p);
}

// xorshift64* state; one per sequence so sampling is reproducible per seed.
struct Rng {
  uint64_t state;
  explicit Rng(uint64_t seed) : state(seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull) {
    if (state == 0) state = 0x2545F4914F6CDD1Dull;
  }
  uint64_t NextU64() {
    state ^= state >> 12;
    state ^= state << 25;
    state ^= state >> 27;
    return state * 0x2545F4914F6CDD1Dull;
  }
  float NextFloat() { return static_cast<float>(NextU64() >> 40) / 16777216.0f; }  // [0, 1)
};

}  // namespace recall::kernels
