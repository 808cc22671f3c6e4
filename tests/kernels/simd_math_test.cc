// The vector exp used by attention softmax and SiluMul: within 2 ulp of the correctly
// rounded exp over its whole input range, and saturating (not inf/nan) beyond it.
#include "kernels/cpu/simd_math.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "gtest/gtest.h"

namespace recall::kernels::cpu {
namespace {

// Error of a float against a double reference, in units of the float's last place.
double UlpError(float got, double want) {
  const double ulp = std::ldexp(1.0, std::ilogb(static_cast<float>(want)) - 23);
  return std::fabs(got - want) / ulp;
}

std::vector<float> Inputs() {
  std::vector<float> xs;
  for (float x = -87.0f; x <= 88.5f; x += 0.00731f) xs.push_back(x);
  for (float x : {0.0f, -0.0f, 1e-8f, -1e-8f, 0.5f, -0.5f, 1.0f, 88.0f, -87.0f}) xs.push_back(x);
  while (xs.size() % 16 != 0) xs.push_back(0.25f);
  return xs;
}

// Scenario: ~24k inputs across [-87, 88.5]; the worst error is at most 2 ulp.
TEST(SimdMathTest, ExpWithinTwoUlp) {
  const std::vector<float> xs = Inputs();
  std::vector<float> ys(xs.size());
#if defined(RECALL_CPU_AVX512)
  for (size_t i = 0; i < xs.size(); i += 16) {
    _mm512_storeu_ps(&ys[i], Exp16(_mm512_loadu_ps(&xs[i])));
  }
#elif defined(__AVX2__) && defined(__FMA__)
  for (size_t i = 0; i < xs.size(); i += 8) {
    _mm256_storeu_ps(&ys[i], Exp8(_mm256_loadu_ps(&xs[i])));
  }
#else
  GTEST_SKIP() << "no vector exp in this build";
#endif
  double worst = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const double e = UlpError(ys[i], std::exp(static_cast<double>(xs[i])));
    ASSERT_LE(e, 2.0) << "x = " << xs[i] << " got " << ys[i];
    worst = std::max(worst, e);
  }
  RecordProperty("worst_ulp", std::to_string(worst));
}

// Scenario: far outside the range the result saturates to finite values (0 <= y < inf).
TEST(SimdMathTest, ExpSaturates) {
  const float xs[16] = {-1000, -200, -100, -88, 89, 100, 1000, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  float ys[16];
#if defined(RECALL_CPU_AVX512)
  _mm512_storeu_ps(ys, Exp16(_mm512_loadu_ps(xs)));
#elif defined(__AVX2__) && defined(__FMA__)
  _mm256_storeu_ps(ys, Exp8(_mm256_loadu_ps(xs)));
  _mm256_storeu_ps(ys + 8, Exp8(_mm256_loadu_ps(xs + 8)));
#else
  GTEST_SKIP() << "no vector exp in this build";
#endif
  for (int i = 0; i < 7; ++i) {
    EXPECT_TRUE(std::isfinite(ys[i])) << xs[i];
    EXPECT_GE(ys[i], 0.0f) << xs[i];
  }
  EXPECT_LT(ys[0], 1e-37f);
  EXPECT_GT(ys[6], 1e38f);
}

}  // namespace
}  // namespace recall::kernels::cpu
