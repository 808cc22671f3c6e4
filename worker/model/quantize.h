// Int8 weights for a loaded model (LoadOptions::weight_dtype "int8"; kernels/cpu/int8.h):
// every layer's linear weights (q, k, v, o, gate, up, down) and the LM head are quantized
// per output channel (one scale per row) from whatever type they were loaded in. The token
// embeddings stay as loaded: decoding reads one row of them per token, not the whole table.
// A tied LM head gets its own int8 copy.
#pragma once

#include "absl/status/status.h"
#include "worker/model/model.h"

namespace recall::model {

// In place; the loaded weights' storage stays (a file mapping is not read again).
// ResourceExhausted when the int8 copy cannot be allocated. A model already in int8 is left
// as it is.
absl::Status QuantizeWeightsInt8(Model& model);

}  // namespace recall::model
