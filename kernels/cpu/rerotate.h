// The host reference of Backend::RerotateKeys for one key row: RoPE's rotation from position
// `from` to `to`, by the difference of Rope's float angles at the two positions taken in
// double. k: [head_dim], rotated in place.
#pragma once

#include <cstdint>

#include "kernels/tensor.h"

namespace recall::kernels::cpu {

void RerotateRow(float* k, int head_dim, int32_t from, int32_t to, float theta, RopeStyle style);

}  // namespace recall::kernels::cpu
