#include "worker/model/fp8.h"

#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "kernels/half.h"
#include "worker/model/file_storage.h"

namespace recall::model {
namespace {

// A tensor's block scales, checked: grid [grid_rows, grid_cols] of blocks br x bc.
struct BlockScales {
  int64_t br = 0, bc = 0, grid_rows = 0, grid_cols = 0;
  std::vector<float> grid;
};

absl::StatusOr<BlockScales> ReadScales(const std::string& file, const std::string& name,
                                       const SafetensorsTensor& w, const SafetensorsTensor& scale,
                                       int64_t rows, int64_t cols, const int (&block)[2]) {
  const auto error = [&](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": tensor \"", name, "\": ", what));
  };
  if (scale.e4m3) return error("its scales are F8_E4M3 (expected F32, F16 or BF16)");
  BlockScales s;
  const bool per_tensor = block[0] == 0;
  s.br = per_tensor ? rows : block[0];
  s.bc = per_tensor ? cols : block[1];
  s.grid_rows = per_tensor ? 1 : (rows + s.br - 1) / s.br;
  s.grid_cols = per_tensor ? 1 : (cols + s.bc - 1) / s.bc;
  const bool shape_ok = per_tensor ? scale.numel() == 1
                                   : scale.shape.size() == 2 && scale.shape[0] == s.grid_rows &&
                                         scale.shape[1] == s.grid_cols;
  if (!shape_ok) {
    return error(absl::StrCat(
        "_scale_inv has shape ", scale.ShapeString(), ", expected ",
        per_tensor ? std::string("one scale (no weight_block_size in quantization_config)")
                   : absl::StrCat("[", s.grid_rows, ", ", s.grid_cols, "] for blocks of ", s.br,
                                  "x", s.bc, " over [", rows, ", ", cols, "]")));
  }
  s.grid.resize(static_cast<size_t>(s.grid_rows * s.grid_cols));
  for (size_t i = 0; i < s.grid.size(); ++i) {
    s.grid[i] = kernels::LoadAsF32(scale.data, scale.dtype, static_cast<int64_t>(i));
    if (!std::isfinite(s.grid[i]) || s.grid[i] <= 0.0f) {
      return error(absl::StrCat("_scale_inv[", i, "] = ", s.grid[i],
                                " (scales must be finite and positive)"));
    }
  }
  // Every weight times its scale must be a finite bf16 (what WidenFp8 stores; the CUDA
  // kernel widens to f32, a wider range): a finite scale of 1e38 made every weight infinite,
  // and every reply <unk>s without an error.
  const auto* src = static_cast<const uint8_t*>(w.data);
  float table[256];
  for (int c = 0; c < 256; ++c) table[c] = E4M3ToF32(static_cast<uint8_t>(c));
  for (int64_t r = 0; r < rows; ++r) {
    const float* srow = s.grid.data() + (r / s.br) * s.grid_cols;
    for (int64_t c = 0; c < cols; ++c) {
      const uint8_t code = src[r * cols + c];
      if ((code & 0x7F) == 0x7F) return error(absl::StrCat("weight [", r, ", ", c, "] is NaN"));
      const float scale = srow[c / s.bc];
      const float v = table[code] * scale;
      if (!std::isfinite(kernels::Bf16ToF32(kernels::F32ToBf16(v)))) {
        return error(absl::StrCat("weight [", r, ", ", c, "] = ", table[code], " x its scale ",
                                  scale, " overflows (bf16 and f32 hold at most about 3.4e38): ",
                                  "its _scale_inv is too large"));
      }
    }
  }
  return s;
}

}  // namespace

absl::StatusOr<kernels::Matrix> WidenFp8(const std::string& file, const std::string& name,
                                         const SafetensorsTensor& w, const SafetensorsTensor& scale,
                                         int64_t rows, int64_t cols, const int (&block)[2],
                                         Model& model) {
  RECALL_ASSIGN_OR_RETURN(const BlockScales s, ReadScales(file, name, w, scale, rows, cols, block));
  RECALL_ASSIGN_OR_RETURN(std::unique_ptr<HeapStorage> out,
                          HeapStorage::Create(static_cast<size_t>(rows * cols) * 2));
  auto* dst = static_cast<uint16_t*>(out->MutableData());
  const auto* src = static_cast<const uint8_t*>(w.data);
  float table[256];
  for (int c = 0; c < 256; ++c) table[c] = E4M3ToF32(static_cast<uint8_t>(c));
  for (int64_t r = 0; r < rows; ++r) {
    const float* srow = s.grid.data() + (r / s.br) * s.grid_cols;
    for (int64_t c = 0; c < cols; ++c) {
      dst[r * cols + c] = kernels::F32ToBf16(table[src[r * cols + c]] * srow[c / s.bc]);
    }
  }
  kernels::Matrix m{out->data(), kernels::DType::kBF16, rows, cols};
  model.storage.push_back(std::move(out));
  return m;
}

absl::StatusOr<kernels::Matrix> KeepFp8(const std::string& file, const std::string& name,
                                        const SafetensorsTensor& w, const SafetensorsTensor& scale,
                                        int64_t rows, int64_t cols, const int (&block)[2],
                                        Model& model) {
  RECALL_ASSIGN_OR_RETURN(const BlockScales s, ReadScales(file, name, w, scale, rows, cols, block));
  // One scale per tensor: a single block as wide as the row, rounded up to 8 columns.
  const int64_t scale_block = block[0] == 0 ? (cols + 7) / 8 * 8 : s.bc;
  if (scale_block % 8 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        file, ": tensor \"", name, "\": weight_dtype fp8 needs blocks of a multiple of 8 columns (",
        "weight_block_size gives ", s.bc, "); load it with weight_dtype auto (widened to bf16)"));
  }
  kernels::Matrix m{w.data, kernels::DType::kF8E4M3, rows, cols};
  m.scale_block = static_cast<int32_t>(scale_block);
  const int64_t per_row = m.ScaleColumns();  // == s.grid_cols
  RECALL_ASSIGN_OR_RETURN(std::unique_ptr<HeapStorage> out, HeapStorage::Create(m.scale_bytes()));
  auto* scales = static_cast<float*>(out->MutableData());
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(scales + r * per_row, s.grid.data() + (r / s.br) * s.grid_cols,
                static_cast<size_t>(per_row) * sizeof(float));
  }
  m.scales = static_cast<const float*>(out->data());
  model.storage.push_back(std::move(out));
  return m;
}

}  // namespace recall::model
