#include "kernels/cpu/sampling.h"

#include <algorithm>
#include <numeric>

#include "common/logging.h"
#include "kernels/cpu/elementwise.h"

namespace recall::kernels::cpu {

int32_t ArgMax(const float* x, int n) {
  int32_t best = 0;
  for (int i = 1; i < n; ++i) {
    if (x[i] > x[best]) best = i;
  }
  return best;
}

void ApplyReplyPenalties(float* logits, int vocab, const SamplingParams& params,
                         const int32_t* reply, int n_reply) {
  if (!HasReplyPenalties(params) || n_reply <= 0) return;
  // Sorted, equal tokens are neighbours: one pass counts them (no vocabulary-sized table).
  std::vector<int32_t> sorted(reply, reply + n_reply);
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size();) {
    size_t j = i;
    while (j < sorted.size() && sorted[j] == sorted[i]) ++j;
    const int32_t tok = sorted[i];
    if (tok >= 0 && tok < vocab) {
      logits[tok] -= params.frequency_penalty * static_cast<float>(j - i) + params.presence_penalty;
    }
    i = j;
  }
}

void Sampler::ApplyRepetitionPenalty(float* logits, int vocab, float penalty,
                                     const int32_t* history, int n_history) {
  if (static_cast<int>(seen_.size()) < vocab) seen_.resize(vocab, 0);
  for (int i = 0; i < n_history; ++i) {
    const int32_t tok = history[i];
    if (tok < 0 || tok >= vocab || seen_[tok]) continue;
    seen_[tok] = 1;
    logits[tok] = logits[tok] > 0.0f ? logits[tok] / penalty : logits[tok] * penalty;
  }
  for (int i = 0; i < n_history; ++i) {
    const int32_t tok = history[i];
    if (tok >= 0 && tok < vocab) seen_[tok] = 0;
  }
}

int32_t Sampler::Sample(float* logits, int vocab, const SamplingParams& params, Rng& rng,
                        const int32_t* history, int n_history) {
  RECALL_CHECK(vocab >= 1) << "vocab " << vocab;
  if (params.repetition_penalty != 1.0f && params.repetition_penalty > 0.0f) {
    ApplyRepetitionPenalty(logits, vocab, params.repetition_penalty, history, n_history);
  }
  for (const auto& [token, bias] : params.logit_bias) {
    if (token >= 0 && token < vocab) logits[token] += bias;
  }
  if (params.temperature <= 0.0f) return ArgMax(logits, vocab);
  return Pick(logits, vocab, params, rng.NextFloat());
}

int32_t Sampler::Pick(float* logits, int vocab, const SamplingParams& params, float draw) {
  RECALL_CHECK(vocab >= 1) << "vocab " << vocab;
  if (params.temperature <= 0.0f) return ArgMax(logits, vocab);
  for (int i = 0; i < vocab; ++i) logits[i] /= params.temperature;
  if (static_cast<int>(probs_.size()) < vocab) {
    probs_.resize(vocab);
    order_.resize(vocab);
  }
  float* probs = probs_.data();
  std::copy(logits, logits + vocab, probs);
  SoftmaxRow(probs, vocab);

  // More likely first; equal scaled logits rank the lower id first.
  auto before = [logits](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  int32_t* order = order_.data();
  int count = vocab;  // candidates are order[0, count)
  bool sorted = false;
  const bool use_top_p = params.top_p > 0.0f && params.top_p < 1.0f;
  if (params.top_k > 0 && params.top_k < vocab) {
    std::iota(order, order + vocab, 0);
    count = params.top_k;
    std::partial_sort(order, order + count, order + vocab, before);
    sorted = true;
  } else if (use_top_p) {
    // As in run.c: a token below (1 - top_p) / (vocab - 1) cannot be in the nucleus.
    const float cutoff = vocab > 1 ? (1.0f - params.top_p) / (vocab - 1) : 0.0f;
    count = 0;
    for (int i = 0; i < vocab; ++i) {
      if (probs[i] >= cutoff) order[count++] = i;
    }
    if (count == 0) {
      std::iota(order, order + vocab, 0);
      count = vocab;
    }
    std::sort(order, order + count, before);
    sorted = true;
  } else {
    std::iota(order, order + vocab, 0);
  }

  // The cumulative sums are in double: in float, a sum over a large vocabulary (Llama-3's
  // 128K tokens) drifts by about one token's probability, so the draw would land on another
  // token than the exact sums give. The CUDA kernel's sums are exact (fixed point), so in
  // double the host and the device pick alike.
  double mass = 0.0;
  for (int i = 0; i < count; ++i) mass += probs[order[i]];
  if (use_top_p && sorted) {
    const double target = static_cast<double>(params.top_p) * mass;
    double cum = 0.0;
    int keep = count;
    for (int i = 0; i < count; ++i) {
      cum += probs[order[i]];
      if (cum >= target) {
        keep = i + 1;
        break;
      }
    }
    count = keep;
    mass = cum;
  }

  const double r = static_cast<double>(draw) * mass;
  double cdf = 0.0;
  for (int i = 0; i < count; ++i) {
    cdf += probs[order[i]];
    if (r < cdf) return order[i];
  }
  return order[count - 1];  // rounding
}

}  // namespace recall::kernels::cpu
