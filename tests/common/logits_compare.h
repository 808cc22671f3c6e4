// Comparing two runs' next-token distributions, given as logits: the mean KL(p || q) and how
// often their top tokens agree (the tests that check a weight type or a device against a
// reference).
#pragma once

#include <algorithm>
#include <cmath>
#include <vector>

namespace recall::testing {

inline std::vector<double> LogSoftmax(const std::vector<float>& x) {
  const double most = *std::max_element(x.begin(), x.end());
  double sum = 0;
  for (const float v : x) sum += std::exp(v - most);
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = x[i] - most - std::log(sum);
  return out;
}

struct LogitsAgreement {
  double mean_kl = 0;  // nats, KL(p || q) averaged over the positions
  double top1 = 0;     // fraction of positions with the same argmax
};

// p[i], q[i]: the logits at position i. REQUIRES: p.size() == q.size() > 0.
inline LogitsAgreement CompareLogits(const std::vector<std::vector<float>>& p,
                                     const std::vector<std::vector<float>>& q) {
  LogitsAgreement a;
  for (size_t i = 0; i < p.size(); ++i) {
    const std::vector<double> lp = LogSoftmax(p[i]), lq = LogSoftmax(q[i]);
    for (size_t k = 0; k < lp.size(); ++k) a.mean_kl += std::exp(lp[k]) * (lp[k] - lq[k]);
    const bool same = std::max_element(p[i].begin(), p[i].end()) - p[i].begin() ==
                      std::max_element(q[i].begin(), q[i].end()) - q[i].begin();
    a.top1 += same ? 1 : 0;
  }
  a.mean_kl /= static_cast<double>(p.size());
  a.top1 /= static_cast<double>(p.size());
  return a;
}

}  // namespace recall::testing
