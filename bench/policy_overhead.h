// Decode-step cost of each eviction policy relative to FullKV at the same cache length.
#pragma once

#include <string>
#include <vector>

#include "kernels/backend.h"
#include "worker/model/model.h"

namespace recall::bench {

struct PolicyOverheadOptions {
  int prompt = 512;   // tokens prefilled before timing; also the budget C
  int steps = 64;     // timed decode steps
  int window = 32;    // W: lazy evicts every W steps (length in [C, C + W]); lazy+ every step
  std::vector<std::string> policies = {"full", "streaming", "h2o",  "tova",
                                       "rkv",  "vase",      "lazy", "lazy+"};
};

// Prints one line per policy: mean step time (forward + attention probabilities + policy
// bookkeeping and evictions), its difference from a plain FullKV step (no probabilities, no
// evictor) over the same lengths, and the time spent inside SessionEvictor::Step with its
// share of the step. (SnapKV works at prefill only and is not listed.)
void RunPolicyOverhead(const model::Model& model, kernels::Backend& backend,
                       const PolicyOverheadOptions& options);

}  // namespace recall::bench
