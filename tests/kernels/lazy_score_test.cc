// PortableExp and LazyScore (kernels/lazy_score.h) against the C library's exp: close to it,
// and built from exactly rounded operations only (checked where that is observable: exact
// powers of two and the range ends).
#include "kernels/lazy_score.h"

#include <algorithm>
#include <cmath>

#include "gtest/gtest.h"

namespace recall::kernels {
namespace {

TEST(PortableExpTest, WithinTwoUlpsOfTheLibraryExpOverItsRange) {
  int checked = 0;
  for (double x = -708.0; x <= 709.0; x += 0.0137) {
    const double want = std::exp(x), got = PortableExp(x);
    ASSERT_LE(std::fabs(got - want), 2.5e-16 * want) << "x " << x;
    ++checked;
  }
  EXPECT_GT(checked, 100000);
  EXPECT_EQ(PortableExp(0.0), 1.0);
  EXPECT_EQ(PortableExp(-709.0), 0.0);
  EXPECT_EQ(PortableExp(710.0), INFINITY);
  EXPECT_EQ(PortableExp(NAN), INFINITY);
}

TEST(LazyScoreTest, IsTheFormulaOfEvictionMd) {
  for (int t : {1, 10, 64, 4096}) {
    for (int32_t ts = 0; ts <= t; ts += std::max(1, t / 16)) {
      for (int32_t mri : {0, 1, 2, 3, 7, 40, 900}) {
        const double h1 = 2.0 / (1.0 + std::exp(1.0 + (t - ts) / (mri + 1e-5)));
        const double h2 = mri > 0 ? 2.0 / (1.0 + std::exp(mri - 1.0)) : 0.0;
        ASSERT_NEAR(LazyScore(t, ts, mri), h1 + h2, 1e-15 * (h1 + h2) + 1e-300)
            << t << " " << ts << " " << mri;
      }
    }
  }
}

}  // namespace
}  // namespace recall::kernels
