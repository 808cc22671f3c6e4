// Whether a checkpoint's weights are all finite. A NaN or an infinity in a weight (a damaged
// copy, or a training run that diverged) makes every reply garbage without any error, so
// the loaders refuse it, naming the tensor and the element.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "kernels/tensor.h"

namespace recall::model {

// The index of the first element of `n` in `data` (f32, f16 or bf16) that is NaN or
// infinite, or -1 when all are finite. Other dtypes: -1 (fp8 is checked by fp8.h).
int64_t FirstNonFinite(const void* data, kernels::DType dtype, int64_t n);

// OK, or InvalidArgument "FILE: tensor "NAME": weight [r, c] is nan" (as fp8.h says of an
// FP8 weight) for the [rows, cols] tensor at `data`.
absl::Status CheckFinite(const std::string& file, const std::string& name, const void* data,
                         kernels::DType dtype, int64_t rows, int64_t cols);

}  // namespace recall::model
