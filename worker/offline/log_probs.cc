#include "worker/offline/log_probs.h"

#include <algorithm>
#include <cmath>

namespace recall::offline {

void LogSoftmax(const float* logits, int vocab, double* out) {
  double mx = logits[0];
  for (int i = 1; i < vocab; ++i) mx = std::max(mx, static_cast<double>(logits[i]));
  double sum = 0;
  for (int i = 0; i < vocab; ++i) sum += std::exp(logits[i] - mx);
  const double log_z = mx + std::log(sum);
  for (int i = 0; i < vocab; ++i) out[i] = logits[i] - log_z;
}

int32_t Argmax(const float* logits, int vocab) {
  int32_t best = 0;
  for (int i = 1; i < vocab; ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return best;
}

}  // namespace recall::offline
