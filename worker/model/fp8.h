// FP8 checkpoints (config.json quantization_config, quant_method "fp8"; ModelConfig::fp8):
// linear weights stored as E4M3FN bytes (1 sign, 4 exponent bits biased by 7, 3 mantissa
// bits; no infinities, 0x7F/0xFF are NaN, the largest finite value is 448) with a
// `<name>_scale_inv` tensor of one scale per block (weight = e4m3 value * scale, the
// convention of Hugging Face's fine-grained FP8 and DeepSeek-V3's checkpoints). The loader
// widens them to bf16 at load: the CPU runs them as bf16 or, with --weight-dtype int8, as int8
// requantized from the widened values.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/tensor.h"
#include "worker/model/model.h"
#include "worker/model/safetensors.h"

namespace recall::model {

// The value of one E4M3FN byte (NaN for 0x7F and 0xFF).
float E4M3ToF32(uint8_t code);

// Widens the [rows, cols] E4M3 tensor `w` with its scales `scale` (F32, F16 or BF16;
// [ceil(rows / block[0]), ceil(cols / block[1])], or one scale for block {0, 0}) into a new
// bf16 matrix whose storage is appended to `model.storage`. InvalidArgument naming `name`
// (and `file`) for a scale tensor of the wrong shape, a NaN weight or a scale that is not
// finite and positive.
absl::StatusOr<kernels::Matrix> WidenFp8(const std::string& file, const std::string& name,
                                         const SafetensorsTensor& w, const SafetensorsTensor& scale,
                                         int64_t rows, int64_t cols, const int (&block)[2],
                                         Model& model);

}  // namespace recall::model
