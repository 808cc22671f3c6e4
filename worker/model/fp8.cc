#include "worker/model/fp8.h"

#include <cmath>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/half.h"
#include "worker/model/file_storage.h"

namespace recall::model {

float E4M3ToF32(uint8_t code) {
  const float sign = (code & 0x80) ? -1.0f : 1.0f;
  const int exponent = (code >> 3) & 0xF;
  const int mantissa = code & 0x7;
  if (exponent == 0xF && mantissa == 0x7) return std::nanf("");
  if (exponent == 0) return sign * std::ldexp(static_cast<float>(mantissa), -9);  // subnormal
  return sign * std::ldexp(1.0f + static_cast<float>(mantissa) / 8.0f, exponent - 7);
}

absl::StatusOr<kernels::Matrix> WidenFp8(const std::string& file, const std::string& name,
                                         const SafetensorsTensor& w, const SafetensorsTensor& scale,
                                         int64_t rows, int64_t cols, const int (&block)[2],
                                         Model& model) {
  const auto error = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": tensor \"", name, "\": ", what));
  };
  if (scale.e4m3) return error("its scales are F8_E4M3 (expected F32, F16 or BF16)");
  const bool per_tensor = block[0] == 0;
  const int64_t br = per_tensor ? rows : block[0], bc = per_tensor ? cols : block[1];
  const int64_t scale_rows = per_tensor ? 1 : (rows + br - 1) / br;
  const int64_t scale_cols = per_tensor ? 1 : (cols + bc - 1) / bc;
  const bool shape_ok = per_tensor ? scale.numel() == 1
                                   : scale.shape.size() == 2 && scale.shape[0] == scale_rows &&
                                         scale.shape[1] == scale_cols;
  if (!shape_ok) {
    return error(absl::StrCat(
        "_scale_inv has shape ", scale.ShapeString(), ", expected ",
        per_tensor ? std::string("one scale (no weight_block_size in quantization_config)")
                   : absl::StrCat("[", scale_rows, ", ", scale_cols, "] for blocks of ", br, "x",
                                  bc, " over [", rows, ", ", cols, "]")));
  }
  std::vector<float> scales(static_cast<size_t>(scale_rows * scale_cols));
  for (size_t i = 0; i < scales.size(); ++i) {
    scales[i] = kernels::LoadAsF32(scale.data, scale.dtype, static_cast<int64_t>(i));
    if (!std::isfinite(scales[i]) || scales[i] <= 0.0f) {
      return error(absl::StrCat("_scale_inv[", i, "] = ", scales[i],
                                " (scales must be finite and positive)"));
    }
  }
  RECALL_ASSIGN_OR_RETURN(std::unique_ptr<HeapStorage> out,
                          HeapStorage::Create(static_cast<size_t>(rows * cols) * 2));
  auto* dst = static_cast<uint16_t*>(out->MutableData());
  const auto* src = static_cast<const uint8_t*>(w.data);
  float table[256];
  for (int c = 0; c < 256; ++c) table[c] = E4M3ToF32(static_cast<uint8_t>(c));
  for (int64_t r = 0; r < rows; ++r) {
    const float* srow = scales.data() + (r / br) * scale_cols;
    for (int64_t c = 0; c < cols; ++c) {
      const uint8_t code = src[r * cols + c];
      if ((code & 0x7F) == 0x7F) return error(absl::StrCat("weight [", r, ", ", c, "] is NaN"));
      dst[r * cols + c] = kernels::F32ToBf16(table[code] * srow[c / bc]);
    }
  }
  kernels::Matrix m{out->data(), kernels::DType::kBF16, rows, cols};
  model.storage.push_back(std::move(out));
  return m;
}

}  // namespace recall::model
