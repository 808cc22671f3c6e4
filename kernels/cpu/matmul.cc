#include "kernels/cpu/matmul.h"

#include <cblas.h>

#include <algorithm>

#include "kernels/cpu/blas_setup.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/gemv.h"
#include "kernels/cpu/int8.h"

namespace recall::kernels::cpu {
namespace {

// Rows per sgemm share are a multiple of this (OpenBLAS's micro-kernel width).
constexpr int64_t kRowAlign = 16;

}  // namespace

MatMul::MatMul(ThreadPool& pool) : pool_(pool), panels_(pool.num_threads()) { ConfigureBlas(); }

void MatMul::Run(const float* x, int n, const Matrix& w, float* y) {
  // Int8 weights take the int8 GEMV whatever n: its results (activations quantized per row)
  // are then the same for every batch.
  if (n <= kGemvMaxInputs || w.dtype == DType::kI8) {
    RunGemv(x, n, w, y);
  } else {
    RunSgemm(x, n, w, y);
  }
}

void MatMul::RunGemv(const float* x, int n, const Matrix& w, float* y) {
  if (n > 0 && w.rows > 0) Gemv(pool_, x, n, w, y);
}

void MatMul::RunSgemm(const float* x, int n, const Matrix& w, float* y) {
  if (n <= 0 || w.rows == 0) return;
  if (w.cols == 0) {  // BLAS rejects a leading dimension of 0
    std::fill(y, y + n * w.rows, 0.0f);
    return;
  }
  // Shares of whole 16-row blocks; at least ~4 MFLOP per thread.
  const int64_t blocks = (w.rows + kRowAlign - 1) / kRowAlign;
  const int64_t flops_per_block = 2 * kRowAlign * w.cols * n;
  const int64_t min_blocks = std::max<int64_t>(1, (int64_t{4} << 20) / flops_per_block);
  pool_.ParallelFor(blocks, min_blocks, [&](int64_t b0, int64_t b1, int t) {
    SgemmRows(x, n, w, b0 * kRowAlign, std::min(w.rows, b1 * kRowAlign), t, y);
  });
}

void MatMul::SgemmRows(const float* x, int n, const Matrix& w, int64_t r0, int64_t r1, int thread,
                       float* y) {
  const int64_t rows = w.rows, cols = w.cols;
  if (w.dtype == DType::kF32) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, r1 - r0, cols, 1.0f, x, cols,
                w.f32() + r0 * cols, cols, 0.0f, y + r0, rows);
    return;
  }
  const int64_t panel_rows =
      std::max<int64_t>(kRowAlign, kPanelFloats / cols / kRowAlign * kRowAlign);
  std::vector<float>& panel = panels_[thread];
  const int64_t need = std::min(panel_rows, r1 - r0) * cols;
  if (static_cast<int64_t>(panel.size()) < need) panel.resize(need);
  const size_t elem = DTypeSize(w.dtype);
  const char* base = static_cast<const char*>(w.data);
  for (int64_t p0 = r0; p0 < r1; p0 += panel_rows) {
    const int64_t pr = std::min(panel_rows, r1 - p0);
    if (w.dtype == DType::kI8) {
      DequantizeRowsInt8(w, p0, pr, panel.data());
    } else {
      ConvertToF32(base + p0 * cols * elem, w.dtype, pr * cols, panel.data());
    }
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, pr, cols, 1.0f, x, cols, panel.data(),
                cols, 0.0f, y + p0, rows);
  }
}

}  // namespace recall::kernels::cpu
