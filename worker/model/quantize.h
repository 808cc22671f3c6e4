// Int8 (and FP8) weights for a loaded model (LoadOptions::weight_dtype "int8"; kernels/cpu/int8.h):
// every layer's linear weights (q, k, v, o, gate, up, down) are quantized per output channel
// (one scale per row) from whatever type they were loaded in; the LM head and the token
// embeddings by default too (Int8Options; docs/benchmarks.md#int8-weights measures the
// choices). A tied table quantized both ways is one int8 copy for both.
#pragma once

#include "absl/status/status.h"
#include "worker/model/model.h"

namespace recall::model {

// In place; the originals of the quantized matrices are discarded (Storage::Discard: their
// pages go back to the system) unless another view still reads them (a tied LM head).
// ResourceExhausted when the int8 copy cannot be allocated. A model already in int8 is left
// as it is.
struct Int8Options {
  bool lm_head = true;     // else the LM head stays as loaded (it is read whole every token)
  bool embeddings = true;  // else the embeddings stay as loaded (one row is read per token)
};
absl::Status QuantizeWeightsInt8(Model& model, const Int8Options& options = {});

// FP8 weights for a model that is not an FP8 checkpoint (LoadOptions::weight_dtype "fp8";
// an FP8 checkpoint's own weights are kept as stored instead, worker/model/fp8.h): every
// layer's linear weights as E4M3 with one scale per row and block of kFp8Block columns
// (max |w| / 448 over the block; kernels/tensor.h, DType::kF8E4M3). Blocks of one row are
// finer than checkpoints' usual 128 x 128 at the same bytes per row of scales. The LM head
// and the embeddings stay as loaded. The originals are discarded as QuantizeWeightsInt8's.
inline constexpr int kFp8Block = 128;
absl::Status QuantizeWeightsFp8(Model& model);

}  // namespace recall::model
