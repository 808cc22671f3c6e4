// Int8 weights (kernels/cpu/int8.h): quantization's error bound, the GEMV against a reference
// on the same integers and against fp32 within the quantization bound, and its invariance
// (batch, threads, the MatMul paths).
#include "kernels/cpu/int8.h"

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/matmul.h"

namespace recall::kernels::cpu {
namespace {

std::vector<float> Random(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

struct Quantized {
  std::vector<int8_t> q;
  std::vector<float> scales;
  std::vector<int32_t> sums;
  Matrix matrix;
};

Quantized Quantize(const std::vector<float>& w, int64_t rows, int64_t cols) {
  Quantized out;
  out.q.resize(w.size());
  out.scales.resize(static_cast<size_t>(rows));
  out.sums.resize(static_cast<size_t>(rows));
  QuantizeRowsInt8(w.data(), rows, cols, out.q.data(), out.scales.data(), out.sums.data());
  out.matrix = {out.q.data(), DType::kI8, rows, cols, out.scales.data(), out.sums.data()};
  return out;
}

TEST(Int8, QuantizationErrIsAtMostHalfAStepPerElement) {
  const int64_t rows = 37, cols = 130;
  std::vector<float> w = Random(rows * cols, 1);
  for (int64_t c = 0; c < cols; ++c) w[5 * cols + c] = 0.0f;  // a row of zeros
  Quantized q = Quantize(w, rows, cols);
  EXPECT_EQ(q.scales[5], 0.0f);
  for (int64_t r = 0; r < rows; ++r) {
    int most = 0;
    for (int64_t c = 0; c < cols; ++c) {
      const size_t i = static_cast<size_t>(r * cols + c);
      most = std::max(most, std::abs(int{q.q[i]}));
      const float back = q.q[i] * q.scales[r];
      // Half a step, and the float rounding of w * 127 / amax.
      EXPECT_LE(std::fabs(back - w[i]), q.scales[r] * 0.5f * (1 + 1e-5f) + 1e-12f)
          << "row " << r << " col " << c;
    }
    int32_t sum = 0;
    for (int64_t c = 0; c < cols; ++c) sum += q.q[static_cast<size_t>(r * cols + c)];
    EXPECT_EQ(q.sums[r], sum) << "row " << r;
    if (r != 5) {
      EXPECT_EQ(most, 127) << "row " << r << ": its largest element maps to 127";
    }
  }
}

TEST(Int8, ARowWithInfOrNanGetsANanScale) {
  std::vector<float> w = {
      1.0f, std::numeric_limits<float>::infinity(), 2.0f, 3.0f, std::nanf(""), 1.0f, 1.0f, 1.0f};
  Quantized q = Quantize(w, 2, 4);
  EXPECT_TRUE(std::isnan(q.scales[0]));
  EXPECT_TRUE(std::isnan(q.scales[1]));
  ThreadPool pool(1);
  std::vector<float> x(4, 1.0f), y(2);
  GemvInt8(pool, x.data(), 1, q.matrix, y.data());
  EXPECT_TRUE(std::isnan(y[0]));
  EXPECT_TRUE(std::isnan(y[1]));
}

// The same integers and the same float expression as the kernel: sx * s * dot.
std::vector<float> Reference(const std::vector<float>& x, int n, const Quantized& w) {
  const int64_t rows = w.matrix.rows, cols = w.matrix.cols;
  std::vector<int8_t> qx(x.size());
  std::vector<float> sx(static_cast<size_t>(n));
  QuantizeRowsInt8(x.data(), n, cols, qx.data(), sx.data());
  std::vector<float> y(static_cast<size_t>(n * rows));
  for (int j = 0; j < n; ++j) {
    for (int64_t r = 0; r < rows; ++r) {
      int64_t dot = 0;
      for (int64_t k = 0; k < cols; ++k) dot += int64_t{qx[j * cols + k]} * w.q[r * cols + k];
      y[j * rows + r] = sx[j] * w.scales[r] * static_cast<float>(static_cast<int32_t>(dot));
    }
  }
  return y;
}

// Every kernel (the ones this CPU lacks run the plain loops), any shape: rows not a multiple of
// the panels' 32, columns not a multiple of their 4-byte groups, inputs past the panels' 12.
TEST(Int8, EveryKernelEqualsTheIntegerReferenceForAnyShape) {
  ThreadPool pool(2);
  if (!Int8GemvUsesVnni()) GTEST_LOG_(INFO) << "no AVX-512 VNNI here: only the plain loops run";
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{1, 1},
                                   {3, 64},
                                   {13, 65},
                                   {37, 200},
                                   {64, 127},
                                   {101, 576},
                                   {33, 2}}) {
    Quantized w = Quantize(Random(rows * cols, rows + cols), rows, cols);
    for (int n : {1, 2, 3, 4, 5, 9, 12, 13, 16, 25}) {
      const std::vector<float> x = Random(n * cols, 7 * n + cols, 3.0f);
      const std::vector<float> want = Reference(x, n, w);
      for (Int8Kernel kernel : {Int8Kernel::kAuto, Int8Kernel::kVnniRows, Int8Kernel::kVnniPanels,
                                Int8Kernel::kGeneric}) {
        std::vector<float> y(static_cast<size_t>(n * rows), -1.0f);
        GemvInt8(pool, x.data(), n, w.matrix, y.data(), kernel);
        for (size_t i = 0; i < y.size(); ++i) {
          ASSERT_EQ(y[i], want[i]) << rows << "x" << cols << " n " << n << " kernel "
                                   << static_cast<int>(kernel) << " element " << i;
        }
      }
    }
  }
}

TEST(Int8, GemvIsWithinTheQuantizationBoundOfFp32) {
  const int64_t rows = 96, cols = 320;
  const std::vector<float> wf = Random(rows * cols, 3);
  Quantized w = Quantize(wf, rows, cols);
  const int n = 3;
  const std::vector<float> x = Random(n * cols, 4);
  ThreadPool pool(2);
  std::vector<float> y(static_cast<size_t>(n * rows));
  GemvInt8(pool, x.data(), n, w.matrix, y.data());
  for (int j = 0; j < n; ++j) {
    float xmax = 0.0f;
    for (int64_t k = 0; k < cols; ++k) xmax = std::max(xmax, std::fabs(x[j * cols + k]));
    const float sx = xmax / 127.0f;
    for (int64_t r = 0; r < rows; ++r) {
      double exact = 0.0, bound = 0.0;
      for (int64_t k = 0; k < cols; ++k) {
        const double xv = x[j * cols + k], wv = wf[r * cols + k];
        exact += xv * wv;
        // |x w - x' w'| <= |x| |w - w'| + |w'| |x - x'|, each error at most half a step.
        bound += std::fabs(xv) * w.scales[r] * 0.5 + (std::fabs(wv) + w.scales[r]) * sx * 0.5;
      }
      EXPECT_LE(std::fabs(y[j * rows + r] - exact), bound * 1.001 + 1e-4)
          << "input " << j << " row " << r;
    }
  }
}

TEST(Int8, ResultsDoNotDependOnTheBatchTheThreadsOrTheMatMulPath) {
  const int64_t rows = 150, cols = 96;
  Quantized w = Quantize(Random(rows * cols, 9), rows, cols);
  const int n = 40;
  const std::vector<float> x = Random(n * cols, 10);
  ThreadPool one(1), two(2);
  std::vector<float> batched(static_cast<size_t>(n * rows)), alone(static_cast<size_t>(rows));
  MatMul matmul(two);
  matmul.Run(x.data(), n, w.matrix, batched.data());  // n > kGemvMaxInputs: still the GEMV
  for (int j = 0; j < n; ++j) {
    GemvInt8(one, x.data() + j * cols, 1, w.matrix, alone.data());
    for (int64_t r = 0; r < rows; ++r) {
      ASSERT_EQ(batched[j * rows + r], alone[r]) << "input " << j << " row " << r;
    }
  }
  // The widening sgemm path (fp32 activations) is close, not equal.
  std::vector<float> widened(batched.size());
  matmul.RunSgemm(x.data(), n, w.matrix, widened.data());
  double worst = 0.0, scale = 0.0;
  for (size_t i = 0; i < widened.size(); ++i) {
    worst = std::max(worst, static_cast<double>(std::fabs(widened[i] - batched[i])));
    scale = std::max(scale, static_cast<double>(std::fabs(widened[i])));
  }
  EXPECT_LT(worst, 0.02 * scale);
}

}  // namespace
}  // namespace recall::kernels::cpu
