// Next-token distributions from logits, in double: what the quality benchmarks and
// `recall calibrate-window` compare caches by.
#pragma once

#include <cstdint>

namespace recall::offline {

// log softmax in double. logits: [vocab]; out: [vocab].
void LogSoftmax(const float* logits, int vocab, double* out);

// Greedy choice: the largest logit, ties to the lowest id.
int32_t Argmax(const float* logits, int vocab);

}  // namespace recall::offline
