// FP8 checkpoints (config.json quantization_config, quant_method "fp8"; ModelConfig::fp8):
// linear weights stored as E4M3FN bytes (1 sign, 4 exponent bits biased by 7, 3 mantissa
// bits; no infinities, 0x7F/0xFF are NaN, the largest finite value is 448) with a
// `<name>_scale_inv` tensor of one scale per block (weight = e4m3 value * scale, the
// convention of Hugging Face's fine-grained FP8 and DeepSeek-V3's checkpoints). The loader
// widens them to bf16 at load: the CPU runs them as bf16 or, with --weight-dtype int8, as int8
// requantized from the widened values. With --weight-dtype fp8 it keeps them as E4M3 bytes
// (DType::kF8E4M3, half bf16's bytes), which only the CUDA backend multiplies.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/fp8.h"
#include "kernels/tensor.h"
#include "worker/model/model.h"
#include "worker/model/safetensors.h"

namespace recall::model {

using kernels::E4M3ToF32;

// Widens the [rows, cols] E4M3 tensor `w` with its scales `scale` (F32, F16 or BF16;
// [ceil(rows / block[0]), ceil(cols / block[1])], or one scale for block {0, 0}) into a new
// bf16 matrix whose storage is appended to `model.storage`. InvalidArgument naming `name`
// (and `file`) for a scale tensor of the wrong shape, a NaN weight or a scale that is not
// finite and positive.
absl::StatusOr<kernels::Matrix> WidenFp8(const std::string& file, const std::string& name,
                                         const SafetensorsTensor& w, const SafetensorsTensor& scale,
                                         int64_t rows, int64_t cols, const int (&block)[2],
                                         Model& model);

// The same weights kept as E4M3: a view of w's bytes (checked for NaN) with the scales
// spread to one per row and block of columns (kernels/tensor.h, DType::kF8E4M3) in storage
// appended to `model.storage`. The errors of WidenFp8, and InvalidArgument when the blocks'
// columns are not a multiple of 8 (the CUDA kernel reads 8 columns under one scale).
absl::StatusOr<kernels::Matrix> KeepFp8(const std::string& file, const std::string& name,
                                        const SafetensorsTensor& w, const SafetensorsTensor& scale,
                                        int64_t rows, int64_t cols, const int (&block)[2],
                                        Model& model);

}  // namespace recall::model
