// MatMul (y = x * w^T) against a double-precision plain loop over the same f32 weight
// values, for every weight dtype, for n on both sides of the GEMV / sgemm switch and for
// shapes that are and are not multiples of the SIMD width.
#include "kernels/cpu/matmul.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cpu/thread_pool.h"
#include "tests/kernels/reference.h"

namespace recall::kernels {
namespace {

using testing::RandomMatrix;
using testing::RandomVector;

struct Shape {
  int rows;
  int cols;
};

class MatMulTest : public ::testing::TestWithParam<std::tuple<DType, int, Shape>> {
 protected:
  static Backend& backend() {
    static std::unique_ptr<Backend> b = CreateCpuBackend({2});
    return *b;
  }
  static cpu::MatMul& matmul() {
    static cpu::ThreadPool pool(2);
    static cpu::MatMul m(pool);
    return m;
  }

  // Asserts y (from `path`) matches the double-precision reference within a bound
  // proportional to sum |w| |x| (float accumulation order differs).
  static void ExpectMatches(const char* path, const std::vector<double>& ref,
                            const std::vector<double>& mag, const std::vector<float>& y) {
    for (size_t i = 0; i < y.size(); ++i) {
      ASSERT_NEAR(y[i], ref[i], 1e-5 * mag[i] + 1e-6) << path << ": output " << i;
    }
  }
};

// Scenario: y = x * w^T with random weights of the given dtype, through the backend (which
// picks the path by n) and through each path forced (GEMV and sgemm, whatever n).
TEST_P(MatMulTest, MatchesReference) {
  const auto [dtype, n, shape] = GetParam();
  testing::TestMatrix w = RandomMatrix(dtype, shape.rows, shape.cols, 7 + n + shape.rows);
  const std::vector<float> x = RandomVector(static_cast<int64_t>(n) * shape.cols, 99 + n);
  const size_t out = static_cast<size_t>(n) * shape.rows;
  std::vector<double> ref(out, 0.0), mag(out, 0.0);
  for (int j = 0; j < n; ++j) {
    for (int r = 0; r < shape.rows; ++r) {
      for (int k = 0; k < shape.cols; ++k) {
        const double p = static_cast<double>(w.values[static_cast<size_t>(r) * shape.cols + k]) *
                         x[static_cast<size_t>(j) * shape.cols + k];
        ref[static_cast<size_t>(j) * shape.rows + r] += p;
        mag[static_cast<size_t>(j) * shape.rows + r] += std::fabs(p);
      }
    }
  }
  std::vector<float> y(out, -12345.0f);
  backend().MatMul(x.data(), n, w.m, y.data());
  ExpectMatches("backend", ref, mag, y);
  std::fill(y.begin(), y.end(), -12345.0f);
  matmul().RunGemv(x.data(), n, w.m, y.data());
  ExpectMatches("gemv", ref, mag, y);
  std::fill(y.begin(), y.end(), -12345.0f);
  matmul().RunSgemm(x.data(), n, w.m, y.data());
  ExpectMatches("sgemm", ref, mag, y);
}

INSTANTIATE_TEST_SUITE_P(
    DtypesAndShapes, MatMulTest,
    ::testing::Combine(::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                       ::testing::Values(1, 2, 3, 5, 8, cpu::MatMul::kGemvMaxInputs,
                                         cpu::MatMul::kGemvMaxInputs + 1, 33, 200),
                       ::testing::Values(Shape{1, 1}, Shape{37, 70}, Shape{13, 16},
                                         Shape{576, 1536}, Shape{1100, 24})),
    [](const auto& info) {
      const Shape s = std::get<2>(info.param);
      return std::string(DTypeName(std::get<0>(info.param))) + "_n" +
             std::to_string(std::get<1>(info.param)) + "_" + std::to_string(s.rows) + "x" +
             std::to_string(s.cols);
    });

// Scenario: the GEMV gives bit-identical results for 1 and 3 threads (the row split does
// not change any output's arithmetic); the sgemm path split over 3 threads (odd shares of
// 16-row blocks, bf16 panels per thread) agrees with 1 thread to float rounding.
TEST(MatMulThreads, SameResultForAnyThreadCount) {
  testing::TestMatrix w = RandomMatrix(DType::kBF16, 1031, 96, 3);
  for (int n : {3, 40}) {
    const std::vector<float> x = RandomVector(n * 96, 4);
    std::vector<float> y1(n * 1031), y3(n * 1031);
    CreateCpuBackend({1})->MatMul(x.data(), n, w.m, y1.data());
    CreateCpuBackend({3})->MatMul(x.data(), n, w.m, y3.data());
    if (n <= cpu::MatMul::kGemvMaxInputs) {
      EXPECT_EQ(y1, y3);
    } else {
      for (size_t i = 0; i < y1.size(); ++i) ASSERT_NEAR(y1[i], y3[i], 1e-5) << i;
    }
  }
}

// Scenario: n = 0 writes nothing.
TEST(MatMulEdge, ZeroInputsWritesNothing) {
  testing::TestMatrix w = RandomMatrix(DType::kF32, 4, 8, 1);
  float y = 7.0f;
  CreateCpuBackend({2})->MatMul(nullptr, 0, w.m, &y);
  EXPECT_EQ(y, 7.0f);
}

}  // namespace
}  // namespace recall::kernels
